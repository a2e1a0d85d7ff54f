// MLX's gathered GEMMs (steel_gemm_gather.h: gather_mm_rhs, gather_mm), as
// MLX's steel_gemm_gather.metal instantiates them: every transpose at two
// of its tile shapes (and the right-hand gather at its own), for float32,
// float16 and bfloat16.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"
#include "mlx/backend/metal/kernels/steel/gemm/kernels/steel_gemm_gather.h"

#define gather_one(kernel, tname, ta, tb, iname, itype, bm, bn, bk, wm, wn)                        \
  instantiate_kernel("steel_" #kernel "_" #tname "_" #iname "_" #iname "_bm" #bm "_bn" #bn "_bk" #bk \
                     "_wm" #wm "_wn" #wn,                                                          \
                     kernel, itype, bm, bn, bk, wm, wn, ta, tb, float)
#define gather_type(iname, itype)                                       \
  gather_one(gather_mm_rhs, nn, false, false, iname, itype, 16, 64, 16, 1, 2) \
  gather_one(gather_mm_rhs, nt, false, true, iname, itype, 16, 64, 16, 1, 2)  \
  gather_one(gather_mm, nn, false, false, iname, itype, 64, 64, 16, 2, 2)     \
  gather_one(gather_mm, nt, false, true, iname, itype, 64, 64, 16, 2, 2)      \
  gather_one(gather_mm, tn, true, false, iname, itype, 32, 32, 16, 2, 2)      \
  gather_one(gather_mm, tt, true, true, iname, itype, 32, 32, 16, 2, 2)

gather_type(float32, float)
gather_type(float16, half)
gather_type(bfloat16, bfloat16_t)
