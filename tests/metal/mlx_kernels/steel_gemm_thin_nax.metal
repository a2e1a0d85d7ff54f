// MLX's NAX GEMM for thin left operands (steel_gemm_thin_nax.h), as MLX's
// steel_gemm_thin_nax.metal instantiates it: both right-hand transposes at
// its two shapes, for float16 and bfloat16. Language: Metal 4.0.
#include <metal_stdlib>
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm_nax.h"
#include "mlx/backend/metal/kernels/steel/gemm/kernels/steel_gemm_thin_nax.h"

#define thin_one(tname, tb, iname, itype, um, un, sm, sn, ks)                                       \
  instantiate_kernel("steel_gemm_thin_nax_" #tname "_" #iname "_um" #um "_un" #un "_sm" #sm "_sn" #sn \
                     "_ks" #ks,                                                                      \
                     gemm_thin_nax, itype, um, un, sm, sn, ks, tb)
#define thin_type(iname, itype)                         \
  thin_one(nn, false, iname, itype, 2, 2, 1, 1, 4)      \
  thin_one(nt, true, iname, itype, 2, 2, 1, 1, 4)       \
  thin_one(nn, false, iname, itype, 2, 2, 1, 2, 2)      \
  thin_one(nt, true, iname, itype, 2, 2, 1, 2, 2)

thin_type(float16, half)
thin_type(bfloat16, bfloat)
