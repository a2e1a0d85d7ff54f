// MLX's NAX GEMM (steel/gemm/{nax,gemm_nax}.h, steel_gemm_fused_nax.h: Metal
// 4 TensorOps matmul2d on cooperative tensors), instantiated as MLX's
// steel_gemm_fused_nax.metal does: the four transposes at a sample of its
// tile shapes, for float16, bfloat16 and float32. Language: Metal 4.0.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm_nax.h"
#include "mlx/backend/metal/kernels/steel/gemm/kernels/steel_gemm_fused_nax.h"

#define gemm_one(tname, trans_a, trans_b, iname, itype, bm, bn, bk, wm, wn)                   \
  instantiate_kernel("steel_gemm_fused_nax_" #tname "_" #iname "_" #iname "_bm" #bm "_bn" #bn   \
                     "_bk" #bk "_wm" #wm "_wn" #wn,                                             \
                     gemm, itype, bm, bn, bk, wm, wn, trans_a, trans_b, float)
#define gemm_transposes(iname, itype, bm, bn, bk, wm, wn)             \
  gemm_one(nn, false, false, iname, itype, bm, bn, bk, wm, wn)        \
  gemm_one(nt, false, true, iname, itype, bm, bn, bk, wm, wn)         \
  gemm_one(tn, true, false, iname, itype, bm, bn, bk, wm, wn)         \
  gemm_one(tt, true, true, iname, itype, bm, bn, bk, wm, wn)

gemm_transposes(float16, half, 64, 64, 256, 2, 2)
gemm_transposes(float16, half, 128, 128, 512, 4, 4)
gemm_transposes(bfloat16, bfloat, 64, 128, 64, 2, 4)
gemm_transposes(bfloat16, bfloat, 128, 128, 256, 4, 4)
gemm_transposes(float32, float, 64, 64, 256, 2, 2)
gemm_transposes(float32, float, 128, 128, 64, 4, 4)
