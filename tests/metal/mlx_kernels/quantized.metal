// MLX's affine quantized kernels (quantized.h, quantized_utils.h, with the
// steel GEMM headers), as MLX's quantized.metal instantiates them: every
// kernel for float32, float16 and bfloat16 at group size 64 and 4 bits, and
// the other bit widths and group sizes for one kernel family each.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"
#include "mlx/backend/metal/kernels/quantized_utils.h"
#include "mlx/backend/metal/kernels/quantized.h"

#define q_name(name, type, gs, bits, tail) #name "_" #type "_gs_" #gs "_b_" #bits tail
#define q_all(type, gs, bits)                                                                          \
  instantiate_kernel(q_name(affine_quantize, type, gs, bits, ""), affine_quantize, type, gs, bits)        \
  instantiate_kernel(q_name(affine_dequantize, type, gs, bits, ""), affine_dequantize, type, gs, bits)    \
  instantiate_kernel(q_name(affine_gather_qmv_fast, type, gs, bits, ""), affine_gather_qmv_fast, type, gs, bits) \
  instantiate_kernel(q_name(affine_gather_qmv, type, gs, bits, ""), affine_gather_qmv, type, gs, bits)    \
  instantiate_kernel(q_name(affine_gather_qvm, type, gs, bits, ""), affine_gather_qvm, type, gs, bits)    \
  instantiate_kernel(q_name(affine_gather_qmm_n, type, gs, bits, ""), affine_gather_qmm_n, type, gs, bits) \
  instantiate_kernel(q_name(affine_qmv_fast, type, gs, bits, "_batch_0"), affine_qmv_fast, type, gs, bits, false) \
  instantiate_kernel(q_name(affine_qmv_fast, type, gs, bits, "_batch_1"), affine_qmv_fast, type, gs, bits, true)  \
  instantiate_kernel(q_name(affine_qmv, type, gs, bits, "_batch_0"), affine_qmv, type, gs, bits, false)   \
  instantiate_kernel(q_name(affine_qvm, type, gs, bits, "_batch_0"), affine_qvm, type, gs, bits, false)   \
  instantiate_kernel(q_name(affine_qmm_n, type, gs, bits, "_batch_0"), affine_qmm_n, type, gs, bits, false) \
  instantiate_kernel(q_name(affine_gather_qmm_t, type, gs, bits, "_alN_true"), affine_gather_qmm_t, type, gs, bits, true) \
  instantiate_kernel(q_name(affine_qmm_t, type, gs, bits, "_alN_true_batch_0"), affine_qmm_t, type, gs, bits, true, false) \
  instantiate_kernel(q_name(affine_qmm_t, type, gs, bits, "_alN_false_batch_1"), affine_qmm_t, type, gs, bits, false, true) \
  instantiate_kernel(q_name(affine_qmv_quad, type, gs, bits, "_d_64_batch_0"), affine_qmv_quad, type, gs, bits, 64, false) \
  instantiate_kernel(q_name(affine_qmv_quad, type, gs, bits, "_d_128_batch_1"), affine_qmv_quad, type, gs, bits, 128, true) \
  instantiate_kernel(q_name(affine_qmv_wide, type, gs, bits, "_nv_2_kl_8_batch_0"), affine_qmv_wide, type, gs, bits, 2, 8, false) \
  instantiate_kernel(q_name(affine_qmv_wide, type, gs, bits, "_nv_5_kl_8_batch_1"), affine_qmv_wide, type, gs, bits, 5, 8, true) \
  instantiate_kernel(q_name(affine_qvm_split_k, type, gs, bits, "_spk_8"), affine_qvm_split_k, type, gs, bits, 8) \
  instantiate_kernel(q_name(affine_qmm_t_splitk, type, gs, bits, "_alN_true"), affine_qmm_t_splitk, type, gs, bits, true) \
  instantiate_kernel(q_name(affine_qmm_t_splitk, type, gs, bits, "_alN_false"), affine_qmm_t_splitk, type, gs, bits, false) \
  instantiate_kernel(q_name(affine_gather_qmm_rhs_nt, type, gs, bits, "_bm_16_bn_32_bk_32_wm_1_wn_2"), \
                     affine_gather_qmm_rhs, type, gs, bits, 16, 32, 32, 1, 2, true)                    \
  instantiate_kernel(q_name(affine_gather_qmm_rhs_nn, type, gs, bits, "_bm_16_bn_32_bk_32_wm_1_wn_2"), \
                     affine_gather_qmm_rhs, type, gs, bits, 16, 32, 32, 1, 2, false)
#define q_mm(type, gs, bits)                                                                           \
  instantiate_kernel(q_name(affine_qmm_t, type, gs, bits, "_alN_false_batch_0"), affine_qmm_t, type, gs, bits, false, false) \
  instantiate_kernel(q_name(affine_qmv, type, gs, bits, "_batch_1"), affine_qmv, type, gs, bits, true)    \
  instantiate_kernel(q_name(affine_dequantize, type, gs, bits, ""), affine_dequantize, type, gs, bits)

q_all(float, 64, 4)
q_all(float16_t, 64, 4)
q_all(bfloat16_t, 64, 4)
q_all(float16_t, 32, 8)
q_mm(float, 128, 2)
q_mm(float, 32, 3)
q_mm(bfloat16_t, 64, 5)
q_mm(float16_t, 128, 6)
q_mm(float, 64, 8)
