// MLX's NAX affine quantized matmuls (quantized_nax.h), as MLX's
// quantized_nax.metal instantiates them: each kernel at its tile shapes for
// float32, float16 and bfloat16 at group size 64 and 4 bits, and other bit
// widths and group sizes for a sample. Language: Metal 4.0.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"
#include "mlx/backend/metal/kernels/steel/gemm/nax.h"
#include "mlx/backend/metal/kernels/steel/gemm/loader.h"
#include "mlx/backend/metal/kernels/quantized_nax.h"

#define qn_name(name, type, gs, bits, tail) #name "_" #type "_gs_" #gs "_b_" #bits tail
#define qn_all(type, gs, bits)                                                                              \
  instantiate_kernel(qn_name(affine_qmm_n_nax, type, gs, bits, "_bm64_bn64_bk64_wm2_wn2_batch_1"),           \
                     affine_qmm_n_nax, type, gs, bits, true, 64, 64, 64, 2, 2)                               \
  instantiate_kernel(qn_name(affine_gather_qmm_n_nax, type, gs, bits, ""), affine_gather_qmm_n_nax, type, gs, bits, \
                     64, 64, 64, 2, 2)                                                                       \
  instantiate_kernel(qn_name(affine_gather_qmm_t_nax, type, gs, bits, "_bm64_bn64_bk64_wm2_wn2_alN_true"),   \
                     affine_gather_qmm_t_nax, type, gs, bits, true, 64, 64, 64, 2, 2)                        \
  instantiate_kernel(qn_name(affine_qmm_t_nax, type, gs, bits, "_bm64_bn64_bk64_wm2_wn2_alN_false_batch_0"), \
                     affine_qmm_t_nax, type, gs, bits, false, false, 64, 64, 64, 2, 2)                       \
  instantiate_kernel(qn_name(affine_qmm_t_nax, type, gs, bits, "_bm32_bn64_bk64_wm2_wn2_alN_true_batch_1"),  \
                     affine_qmm_t_nax, type, gs, bits, true, true, 32, 64, 64, 2, 2)                         \
  instantiate_kernel(qn_name(affine_gather_qmm_rhs_nax_nt, type, gs, bits, "_bm_64_bn_64_bk_64_wm_2_wn_2"),  \
                     affine_gather_qmm_rhs_nax, type, gs, bits, 64, 64, 64, 2, 2, true)                      \
  instantiate_kernel(qn_name(affine_gather_qmm_rhs_nax_nn, type, gs, bits, "_bm_32_bn_64_bk_64_wm_2_wn_2"),  \
                     affine_gather_qmm_rhs_nax, type, gs, bits, 32, 64, 64, 2, 2, false)
#define qn_sample(type, gs, bits)                                                                           \
  instantiate_kernel(qn_name(affine_qmm_t_nax, type, gs, bits, "_bm64_bn64_bk64_wm2_wn2_alN_true_batch_0"),  \
                     affine_qmm_t_nax, type, gs, bits, true, false, 64, 64, 64, 2, 2)

qn_all(float, 64, 4)
qn_all(float16_t, 64, 4)
qn_all(bfloat16_t, 64, 4)
qn_sample(float, 128, 2)
qn_sample(float16_t, 32, 3)
qn_sample(bfloat16_t, 64, 5)
qn_sample(float, 128, 6)
qn_sample(float16_t, 32, 8)
