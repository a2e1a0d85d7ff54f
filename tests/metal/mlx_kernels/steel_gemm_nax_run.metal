// MLX's NAX GEMM for the executor's runs: the four transposes at one tile
// shape (64x64, K chunks of 256, 2x2 simdgroups) for float16, bfloat16 and
// float32. Language: Metal 4.0.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm_nax.h"
#include "mlx/backend/metal/kernels/steel/gemm/kernels/steel_gemm_fused_nax.h"

#define gemm_one(tname, trans_a, trans_b, iname, itype)                                    \
  instantiate_kernel("steel_gemm_fused_nax_" #tname "_" #iname "_" #iname                    \
                     "_bm64_bn64_bk256_wm2_wn2",                                             \
                     gemm, itype, 64, 64, 256, 2, 2, trans_a, trans_b, float)
#define gemm_transposes(iname, itype)             \
  gemm_one(nn, false, false, iname, itype)        \
  gemm_one(nt, false, true, iname, itype)         \
  gemm_one(tn, true, false, iname, itype)         \
  gemm_one(tt, true, true, iname, itype)

gemm_transposes(float16, half)
gemm_transposes(bfloat16, bfloat)
gemm_transposes(float32, float)
