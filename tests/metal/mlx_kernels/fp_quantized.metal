// MLX's floating-point quantized kernels (fp_quantized.h, fp4.h, fp8.h), as
// MLX's fp_quantized.metal instantiates them: every kernel for the nvfp4
// mode (group 16, 4 bits) in float32, float16 and bfloat16, with and
// without a global scale, and the mxfp8 and mxfp4 modes for a sample.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"
#include "mlx/backend/metal/kernels/quantized_utils.h"
#include "mlx/backend/metal/kernels/fp_quantized.h"

#define fq_name(mode, name, type, gs, bits, tail) #mode "_" #name "_" #type "_gs_" #gs "_b_" #bits tail
#define fq_all(mode, type, gs, bits)                                                                          \
  instantiate_kernel(fq_name(mode, qmv_fast, type, gs, bits, "_batch_0"), fp_qmv_fast, type, gs, bits, false)   \
  instantiate_kernel(fq_name(mode, qmv_fast, type, gs, bits, "_batch_1_hgs"), fp_qmv_fast, type, gs, bits, true, \
                     false, true)                                                                              \
  instantiate_kernel(fq_name(mode, qmv_fast, type, gs, bits, "_r_2_batch_0"), fp_qmv_fast, type, gs, bits, false, \
                     false, false, 2)                                                                          \
  instantiate_kernel(fq_name(mode, qmv, type, gs, bits, "_batch_1"), fp_qmv, type, gs, bits, true)              \
  instantiate_kernel(fq_name(mode, qvm, type, gs, bits, "_batch_0_hgs"), fp_qvm, type, gs, bits, false, true)    \
  instantiate_kernel(fq_name(mode, qmm_n, type, gs, bits, "_batch_0"), fp_qmm_n, type, gs, bits, false)         \
  instantiate_kernel(fq_name(mode, gather_qmv_fast, type, gs, bits, ""), fp_gather_qmv_fast, type, gs, bits)     \
  instantiate_kernel(fq_name(mode, gather_qmv, type, gs, bits, "_hgs"), fp_gather_qmv, type, gs, bits, true)     \
  instantiate_kernel(fq_name(mode, gather_qvm, type, gs, bits, ""), fp_gather_qvm, type, gs, bits)               \
  instantiate_kernel(fq_name(mode, gather_qmm_n, type, gs, bits, "_hgs"), fp_gather_qmm_n, type, gs, bits, true)   \
  instantiate_kernel(fq_name(mode, qmv_quad, type, gs, bits, "_d_64_batch_0"), fp_qmv_quad, type, gs, bits, 64, false) \
  instantiate_kernel(fq_name(mode, qmv_quad, type, gs, bits, "_d_128_batch_1"), fp_qmv_quad, type, gs, bits, 128, true) \
  instantiate_kernel(fq_name(mode, qmv_wide, type, gs, bits, "_nv_2_kl_16_batch_0"), fp_qmv_wide, type, gs, bits, 2, 16, \
                     false)                                                                                    \
  instantiate_kernel(fq_name(mode, qvm_split_k, type, gs, bits, "_spk_8"), fp_qvm_split_k, type, gs, bits, 8)    \
  instantiate_kernel(fq_name(mode, qmm_t_splitk, type, gs, bits, "_alN_true"), fp_qmm_t_splitk, type, gs, bits, true) \
  instantiate_kernel(fq_name(mode, gather_qmm_t, type, gs, bits, "_alN_false"), fp_gather_qmm_t, type, gs, bits, false) \
  instantiate_kernel(fq_name(mode, qmm_t, type, gs, bits, "_alN_true_batch_0"), fp_qmm_t, type, gs, bits, true, false) \
  instantiate_kernel(fq_name(mode, qmm_t, type, gs, bits, "_alN_false_batch_1"), fp_qmm_t, type, gs, bits, false, true) \
  instantiate_kernel(fq_name(mode, gather_qmm_rhs_nt, type, gs, bits, "_bm_16_bn_32_bk_32_wm_1_wn_2"),          \
                     fp_gather_qmm_rhs, type, gs, bits, 16, 32, 32, 1, 2, true)                                \
  instantiate_kernel(fq_name(mode, gather_qmm_rhs_nn, type, gs, bits, "_bm_16_bn_32_bk_32_wm_1_wn_2"),          \
                     fp_gather_qmm_rhs, type, gs, bits, 16, 32, 32, 1, 2, false)                               \
  instantiate_kernel(fq_name(mode, quantize, type, gs, bits, "_hgs_false"), fp_quantize, type, gs, bits, false)  \
  instantiate_kernel(fq_name(mode, dequantize, type, gs, bits, "_hgs_false"), fp_dequantize, type, gs, bits, false)
#define fq_sample(mode, type, gs, bits)                                                                        \
  instantiate_kernel(fq_name(mode, qmm_t, type, gs, bits, "_alN_false_batch_0"), fp_qmm_t, type, gs, bits, false, false) \
  instantiate_kernel(fq_name(mode, qmv, type, gs, bits, "_batch_0"), fp_qmv, type, gs, bits, false)             \
  instantiate_kernel(fq_name(mode, quantize, type, gs, bits, "_hgs_false"), fp_quantize, type, gs, bits, false)  \
  instantiate_kernel(fq_name(mode, dequantize, type, gs, bits, "_hgs_false"), fp_dequantize, type, gs, bits, false)

fq_all(nvfp4, float, 16, 4)
fq_all(nvfp4, float16_t, 16, 4)
fq_all(nvfp4, bfloat16_t, 16, 4)
instantiate_kernel("nvfp4_quantize_float_gs_16_b_4_hgs_true", fp_quantize, float, 16, 4, true)
instantiate_kernel("nvfp4_dequantize_bfloat16_t_gs_16_b_4_hgs_true", fp_dequantize, bfloat16_t, 16, 4, true)
instantiate_kernel("nvfp4_quantize_dequantize_float16_t_gs_16_b_4_hgs_true", fp_quantize_dequantize, float16_t, 16, 4, true)
fq_sample(mxfp8, float, 32, 8)
fq_sample(mxfp8, bfloat16_t, 32, 8)
fq_sample(mxfp4, float16_t, 32, 4)
