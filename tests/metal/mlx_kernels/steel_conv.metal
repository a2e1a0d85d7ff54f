// MLX's implicit-GEMM 2D convolution (steel/conv/*.h, steel_conv.h), as
// MLX's steel_conv.metal instantiates it: small and large filters, channel
// counts 1 to 4 and large, at a sample of its block shapes.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/mma.h"
#include "mlx/backend/metal/kernels/steel/conv/conv.h"
#include "mlx/backend/metal/kernels/steel/conv/params.h"
#include "mlx/backend/metal/kernels/steel/conv/kernels/steel_conv.h"

#define conv2d(name, itype, bm, bn, bk, wm, wn, cname, nc, fname, small)                          \
  template [[host_name("implicit_gemm_conv_2d_" #name "_bm" #bm "_bn" #bn "_bk" #bk "_wm" #wm     \
                       "_wn" #wn "_channel_" #cname "_filter_" #fname)]] [[kernel]] void          \
  implicit_gemm_conv_2d<itype, bm, bn, bk, wm, wn, nc, small>(                                     \
      const device itype* A [[buffer(0)]], const device itype* B [[buffer(1)]],                   \
      device itype* C [[buffer(2)]], const constant MLXConvParams<2>* params [[buffer(3)]],        \
      const constant ImplicitGemmConv2DParams* gemm_params [[buffer(4)]],                         \
      uint3 tid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],   \
      uint simd_gid [[simdgroup_index_in_threadgroup]], uint simd_lid [[thread_index_in_simdgroup]]);
#define conv2d_filters(name, itype, bm, bn, bk, wm, wn)                  \
  conv2d(name, itype, bm, bn, bk, wm, wn, l, 0, s, true)                  \
  conv2d(name, itype, bm, bn, bk, wm, wn, l, 0, l, false)                 \
  conv2d(name, itype, bm, bn, bk, wm, wn, 1, 1, l, false)                 \
  conv2d(name, itype, bm, bn, bk, wm, wn, 3, 3, l, false)

conv2d_filters(float32, float, 32, 32, 16, 2, 2)
conv2d_filters(float16, half, 64, 8, 16, 4, 1)
conv2d_filters(bfloat16, bfloat16_t, 64, 64, 16, 2, 2)
