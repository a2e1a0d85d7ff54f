// MLX's matrix-vector kernels (gemv.h), as MLX's gemv.metal instantiates
// them: gemv, gemv_t and their gather forms at a sample of MLX's block
// shapes, and gemv_wide, for float32, float16, bfloat16 and complex64.
#include "mlx/backend/metal/kernels/gemv.h"

#define gemv_one(kind, name, itype, bm, bn, sm, sn, tm, tn, nc, axpby)                             \
  instantiate_kernel(#kind "_" #name "_bm" #bm "_bn" #bn "_sm" #sm "_sn" #sn "_tm" #tm "_tn" #tn   \
                     "_nc" #nc "_axpby" #axpby, kind, itype, bm, bn, sm, sn, tm, tn, nc, axpby)
#define gemv_gather_one(kind, name, itype, bm, bn, sm, sn, tm, tn)                                  \
  instantiate_kernel(#kind "_" #name "_bm" #bm "_bn" #bn "_sm" #sm "_sn" #sn "_tm" #tm "_tn" #tn,  \
                     kind, itype, bm, bn, sm, sn, tm, tn)
#define gemv_type(name, itype)                                  \
  gemv_one(gemv, name, itype, 1, 8, 1, 32, 4, 4, 0, 0)            \
  gemv_one(gemv, name, itype, 4, 1, 1, 32, 1, 4, 1, 1)            \
  gemv_one(gemv, name, itype, 1, 1, 8, 4, 4, 4, 0, 1)             \
  gemv_one(gemv_t, name, itype, 1, 2, 8, 4, 4, 1, 0, 0)           \
  gemv_one(gemv_t, name, itype, 1, 16, 4, 8, 4, 4, 1, 1)          \
  gemv_gather_one(gemv_gather, name, itype, 4, 1, 1, 32, 4, 4)    \
  gemv_gather_one(gemv_t_gather, name, itype, 1, 4, 8, 4, 4, 4)

gemv_type(float32, float)
gemv_type(float16, half)
gemv_type(bfloat16, bfloat16_t)
gemv_type(complex64, complex64_t)
instantiate_kernel("gemv_wide_float16_nv2_kl16", gemv_wide, half, 2, 16)
instantiate_kernel("gemv_wide_bfloat16_nv5_kl32", gemv_wide, bfloat16_t, 5, 32)
instantiate_kernel("gemv_wide_float32_nv3_kl16", gemv_wide, float, 3, 16)
instantiate_kernel("gemv_wide_gather_float16_nv4_kl16", gemv_wide_gather, half, 4, 16)
instantiate_kernel("gemv_wide_gather_bfloat16_nv2_kl32", gemv_wide_gather, bfloat16_t, 2, 32)
