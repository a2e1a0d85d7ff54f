// MLX's split-K GEMM and its accumulation (steel_gemm_splitk.h), as MLX's
// steel_gemm_splitk.metal instantiates them: every transpose, aligned and
// not, at a sample of its tile shapes, float32 partial sums for float32,
// float16 and bfloat16 (complex64 for complex64).
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"
#include "mlx/backend/metal/kernels/steel/gemm/kernels/steel_gemm_splitk.h"

#define splitk_one(tname, ta, tb, iname, itype, oname, otype, bm, bn, bk, wm, wn, aname, mn, kname, k)  \
  instantiate_kernel("steel_gemm_splitk_" #tname "_" #iname "_" #oname "_bm" #bm "_bn" #bn "_bk" #bk    \
                     "_wm" #wm "_wn" #wn "_MN_" #aname "_K_" #kname,                                    \
                     gemm_splitk, itype, otype, bm, bn, bk, wm, wn, ta, tb, mn, k)
#define splitk_type(iname, itype, oname, otype)                                                     \
  splitk_one(nn, false, false, iname, itype, oname, otype, 16, 16, 16, 2, 2, taligned, true, taligned, true)    \
  splitk_one(nt, false, true, iname, itype, oname, otype, 16, 32, 16, 2, 2, naligned, false, taligned, true)    \
  splitk_one(tn, true, false, iname, itype, oname, otype, 32, 16, 16, 2, 2, taligned, true, naligned, false)    \
  splitk_one(tt, true, true, iname, itype, oname, otype, 32, 32, 16, 2, 2, naligned, false, naligned, false)

splitk_type(float32, float, float32, float)
splitk_type(float16, half, float32, float)
splitk_type(bfloat16, bfloat16_t, float32, float)
splitk_type(complex64, complex64_t, complex64, complex64_t)

#define accum(oname, otype, aname, atype)                                                             \
  instantiate_kernel("steel_gemm_splitk_accum_" #oname "_" #aname, gemm_splitk_accum, atype, otype)   \
  instantiate_kernel("steel_gemm_splitk_accum_" #oname "_" #aname "_axbpy", gemm_splitk_accum_axpby,  \
                     atype, otype)
accum(float32, float, float32, float)
accum(float16, half, float32, float)
accum(bfloat16, bfloat16_t, float32, float)
accum(complex64, complex64_t, complex64, complex64_t)
