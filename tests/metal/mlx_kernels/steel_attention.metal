// MLX's steel attention (steel/attn/*.h, steel_attention.h), as MLX's
// steel_attention.metal instantiates it: a sample of head dimensions with
// masks of the value type and bool, for float16, bfloat16 and float32.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/attn/kernels/steel_attention.h"

#define attn_one(tname, T, bq, bk, bd, wm, wn, mname, mtype)                                  \
  instantiate_kernel("steel_attention_" #tname "_bq" #bq "_bk" #bk "_bd" #bd "_wm" #wm "_wn" #wn \
                     "_mask" #mname, attention, T, bq, bk, bd, bd, wm, wn, mtype, float)
#define attn_type(tname, T)                                  \
  attn_one(tname, T, 32, 16, 128, 4, 1, tname, T)            \
  attn_one(tname, T, 32, 32, 64, 4, 1, bool_, bool)          \
  attn_one(tname, T, 32, 32, 80, 4, 1, tname, T)

attn_type(float16, half)
attn_type(bfloat16, bfloat16_t)
attn_type(float32, float)
