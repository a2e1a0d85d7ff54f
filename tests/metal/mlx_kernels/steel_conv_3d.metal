// MLX's implicit-GEMM 3D convolution (steel_conv_3d.h), as MLX's
// steel_conv_3d.metal instantiates it.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/mma.h"
#include "mlx/backend/metal/kernels/steel/conv/conv.h"
#include "mlx/backend/metal/kernels/steel/conv/params.h"
#include "mlx/backend/metal/kernels/steel/conv/kernels/steel_conv_3d.h"

#define conv3d(name, itype, bm, bn, bk, wm, wn, fname, small)                                   \
  instantiate_kernel("implicit_gemm_conv_3d_" #name "_bm" #bm "_bn" #bn "_bk" #bk "_wm" #wm      \
                     "_wn" #wn "_filter_" #fname, implicit_gemm_conv_3d, itype, bm, bn, bk, wm, wn, small)
#define conv3d_filters(name, itype, bm, bn, bk, wm, wn)  \
  conv3d(name, itype, bm, bn, bk, wm, wn, s, true)        \
  conv3d(name, itype, bm, bn, bk, wm, wn, l, false)

conv3d_filters(float32, float, 32, 32, 16, 2, 2)
conv3d_filters(float16, half, 64, 8, 16, 4, 1)
conv3d_filters(bfloat16, bfloat16_t, 64, 64, 16, 2, 2)
