// MLX's steel GEMM (steel/gemm/{gemm,mma,loader,transforms,params}.h,
// steel_gemm_fused.h), instantiated as MLX's steel_gemm_fused.metal does:
// the four transposes at MLX's tile shapes, for float32, float16, bfloat16
// and complex64.
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
#define gemm_shapes(iname, itype)                      \
  gemm_transposes(iname, itype, 64, 64, 16, 2, 2)      \
  gemm_transposes(iname, itype, 64, 64, 16, 1, 2)      \
  gemm_transposes(iname, itype, 64, 32, 32, 2, 2)      \
  gemm_transposes(iname, itype, 32, 64, 16, 1, 2)      \
  gemm_transposes(iname, itype, 32, 32, 16, 2, 2)      \
  gemm_transposes(iname, itype, 64, 32, 8, 4, 1)

gemm_shapes(float32, float)
gemm_shapes(float16, half)
gemm_shapes(bfloat16, bfloat16_t)
gemm_transposes(complex64, complex64_t, 32, 32, 16, 2, 2)
