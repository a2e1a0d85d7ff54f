// MLX's NAX split-K GEMM (steel_gemm_splitk_nax.h), as MLX's
// steel_gemm_splitk_nax.metal instantiates it: every transpose at its tile
// shapes, float32 partial sums for float16, bfloat16 and float32.
// Language: Metal 4.0.
#include <metal_stdlib>
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm_nax.h"
#include "mlx/backend/metal/kernels/steel/gemm/kernels/steel_gemm_splitk_nax.h"

#define splitk_one(tname, ta, tb, iname, itype, bm, bn, bk, wm, wn)                                          \
  instantiate_kernel("steel_gemm_splitk_nax_" #tname "_" #iname "_float32_bm" #bm "_bn" #bn "_bk" #bk        \
                     "_wm" #wm "_wn" #wn,                                                                     \
                     gemm_splitk_nax, itype, bm, bn, bk, wm, wn, ta, tb, float)
#define splitk_type(iname, itype)                                       \
  splitk_one(nn, false, false, iname, itype, 64, 64, 256, 2, 2)         \
  splitk_one(nt, false, true, iname, itype, 64, 64, 256, 2, 2)          \
  splitk_one(tn, true, false, iname, itype, 128, 128, 512, 4, 4)        \
  splitk_one(tt, true, true, iname, itype, 128, 128, 512, 4, 4)

splitk_type(float16, half)
splitk_type(bfloat16, bfloat)
splitk_type(float32, float)
