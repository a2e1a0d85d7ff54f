// MLX's segmented GEMM (steel_gemm_segmented.h), as MLX's
// steel_gemm_segmented.metal instantiates it: every transpose at a sample
// of its tile shapes, for float32, float16 and bfloat16.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"
#include "mlx/backend/metal/kernels/steel/gemm/kernels/steel_gemm_segmented.h"

#define segmented_one(tname, ta, tb, iname, itype, bm, bn, bk, wm, wn)                               \
  instantiate_kernel("steel_segmented_mm_" #tname "_" #iname "_" #iname "_bm" #bm "_bn" #bn "_bk" #bk \
                     "_wm" #wm "_wn" #wn,                                                             \
                     segmented_mm, itype, bm, bn, bk, wm, wn, ta, tb, float)
#define segmented_type(iname, itype)                                      \
  segmented_one(nn, false, false, iname, itype, 64, 64, 16, 2, 2)         \
  segmented_one(nt, false, true, iname, itype, 64, 32, 32, 2, 2)          \
  segmented_one(tn, true, false, iname, itype, 32, 64, 16, 1, 2)          \
  segmented_one(tt, true, true, iname, itype, 32, 32, 16, 2, 2)

segmented_type(float32, float)
segmented_type(float16, half)
segmented_type(bfloat16, bfloat16_t)
