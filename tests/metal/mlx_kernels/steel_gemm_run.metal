// MLX's steel GEMM for the executor's runs: the four transposes at one tile
// shape (32x32x16, 2x2 simdgroups) for float32, float16 and bfloat16, and
// MLX's default shape (64x64x16) for float32 and float16.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"
#include "mlx/backend/metal/kernels/steel/gemm/kernels/steel_gemm_fused.h"

#define gemm_one(tname, trans_a, trans_b, iname, itype, bm, bn, bk, wm, wn)               \
  instantiate_kernel("steel_gemm_fused_" #tname "_" #iname "_" #iname "_bm" #bm "_bn" #bn   \
                     "_bk" #bk "_wm" #wm "_wn" #wn,                                         \
                     gemm, itype, bm, bn, bk, wm, wn, trans_a, trans_b, float)
#define gemm_transposes(iname, itype, bm, bn, bk, wm, wn)             \
  gemm_one(nn, false, false, iname, itype, bm, bn, bk, wm, wn)        \
  gemm_one(nt, false, true, iname, itype, bm, bn, bk, wm, wn)         \
  gemm_one(tn, true, false, iname, itype, bm, bn, bk, wm, wn)         \
  gemm_one(tt, true, true, iname, itype, bm, bn, bk, wm, wn)

gemm_transposes(float32, float, 32, 32, 16, 2, 2)
gemm_transposes(float16, half, 32, 32, 16, 2, 2)
gemm_transposes(bfloat16, bfloat16_t, 32, 32, 16, 2, 2)
gemm_one(nn, false, false, float32, float, 64, 64, 16, 2, 2)
gemm_one(nt, false, true, float16, half, 64, 64, 16, 2, 2)
