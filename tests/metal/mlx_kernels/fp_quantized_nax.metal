// MLX's NAX floating-point quantized matmuls (fp_quantized_nax.h), as MLX's
// fp_quantized_nax.metal instantiates them: the transposed, gathered and
// right-hand-gathered kernels for the nvfp4, mxfp8 and mxfp4 modes at its
// tile shapes, in float32, float16 and bfloat16. MLX instantiates neither
// fp_qmm_n_nax nor fp_gather_qmm_n_nax, which cannot be: they pass
// fp_qmm_n_impl 14 arguments for its 13 (the strict pass says so).
// Language: Metal 4.0.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"
#include "mlx/backend/metal/kernels/quantized_utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/nax.h"
#include "mlx/backend/metal/kernels/fp_quantized_nax.h"

#define fqn_name(mode, name, type, gs, bits, tail) #mode "_" #name "_" #type "_gs_" #gs "_b_" #bits tail
#define fqn_all(mode, type, gs, bits)                                                                           \
  instantiate_kernel(fqn_name(mode, qmm_t_nax, type, gs, bits, "_bm64_bn64_bk64_wm2_wn2_alN_true_batch_0"),      \
                     fp_qmm_t_nax, type, gs, bits, true, false, 64, 64, 64, 2, 2)                                \
  instantiate_kernel(fqn_name(mode, qmm_t_nax, type, gs, bits, "_bm32_bn64_bk64_wm2_wn2_alN_false_batch_1"),     \
                     fp_qmm_t_nax, type, gs, bits, false, true, 32, 64, 64, 2, 2)                                \
  instantiate_kernel(fqn_name(mode, gather_qmm_t_nax, type, gs, bits, "_bm64_bn64_bk64_wm2_wn2_alN_false"),      \
                     fp_gather_qmm_t_nax, type, gs, bits, false, 64, 64, 64, 2, 2)                               \
  instantiate_kernel(fqn_name(mode, gather_qmm_rhs_nax_nt, type, gs, bits, "_bm_64_bn_64_bk_64_wm_2_wn_2"),      \
                     fp_gather_qmm_rhs_nax, type, gs, bits, 64, 64, 64, 2, 2, true)                              \
  instantiate_kernel(fqn_name(mode, gather_qmm_rhs_nax_nn, type, gs, bits, "_bm_32_bn_64_bk_64_wm_2_wn_2"),      \
                     fp_gather_qmm_rhs_nax, type, gs, bits, 32, 64, 64, 2, 2, false)
#define fqn_types(mode, gs, bits)   \
  fqn_all(mode, float, gs, bits)     \
  fqn_all(mode, float16_t, gs, bits) \
  fqn_all(mode, bfloat16_t, gs, bits)

fqn_types(nvfp4, 16, 4)
fqn_types(mxfp8, 32, 8)
fqn_types(mxfp4, 32, 4)
