// MLX's NAX segmented GEMM (steel_gemm_segmented_nax.h), as MLX's
// steel_gemm_segmented_nax.metal instantiates it: every transpose at its
// tile shapes, for float16, bfloat16 and float32. Language: Metal 4.0.
#include <metal_stdlib>
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm_nax.h"
#include "mlx/backend/metal/kernels/steel/gemm/kernels/steel_gemm_segmented_nax.h"

#define segmented_one(tname, ta, tb, iname, itype, bm, bn, bk, wm, wn)                                   \
  instantiate_kernel("steel_segmented_mm_nax_" #tname "_" #iname "_" #iname "_bm" #bm "_bn" #bn "_bk" #bk \
                     "_wm" #wm "_wn" #wn,                                                                 \
                     segmented_mm_nax, itype, bm, bn, bk, wm, wn, ta, tb, float)
#define segmented_type(iname, itype)                                    \
  segmented_one(nn, false, false, iname, itype, 64, 64, 256, 2, 2)      \
  segmented_one(nt, false, true, iname, itype, 64, 64, 128, 2, 2)       \
  segmented_one(tn, true, false, iname, itype, 64, 64, 64, 2, 2)        \
  segmented_one(tt, true, true, iname, itype, 64, 64, 256, 2, 2)

segmented_type(float16, half)
segmented_type(bfloat16, bfloat)
segmented_type(float32, float)
