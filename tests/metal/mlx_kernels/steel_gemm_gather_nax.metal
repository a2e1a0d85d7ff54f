// MLX's NAX gathered GEMM (steel_gemm_gather_nax.h), as MLX's
// steel_gemm_gather_nax.metal instantiates it: both right-hand transposes
// at its tile shapes, for float16, bfloat16 and float32. Language: Metal 4.0.
#include <metal_stdlib>
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm_nax.h"
#include "mlx/backend/metal/kernels/steel/gemm/kernels/steel_gemm_gather_nax.h"

#define gather_one(tname, ta, tb, iname, itype, bm, bn, bk, wm, wn)                                        \
  instantiate_kernel("steel_gather_mm_rhs_nax_" #tname "_" #iname "_" #iname "_bm" #bm "_bn" #bn "_bk" #bk \
                     "_wm" #wm "_wn" #wn,                                                                   \
                     gather_mm_rhs_nax, itype, bm, bn, bk, wm, wn, ta, tb, float)
#define gather_type(iname, itype)                                      \
  gather_one(nn, false, false, iname, itype, 16, 128, 128, 1, 4)       \
  gather_one(nt, false, true, iname, itype, 32, 128, 128, 1, 4)        \
  gather_one(nn, false, false, iname, itype, 64, 128, 128, 2, 4)

gather_type(float16, half)
gather_type(bfloat16, bfloat)
gather_type(float32, float)
