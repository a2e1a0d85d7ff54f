// MLX's NAX attention (steel/attn/nax.h, steel_attention_nax.h), as MLX's
// steel_attention_nax.metal instantiates it: its block shapes (head
// dimensions 64 to 256, the split-head kernel at 256) with masks of the
// input type and of bool, for float16, bfloat16 and float32. The header's
// value dimension (BV) is the head dimension here, and 128 beside a
// 192-wide key once. Language: Metal 4.0.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/attn/kernels/steel_attention_nax.h"

#define attn_one(tname, dtype, bq, bk, bd, bv, wm, wn, mname, mtype)                                   \
  instantiate_kernel("steel_attention_" #tname "_bq" #bq "_bk" #bk "_bd" #bd "_bv" #bv "_wm" #wm "_wn" #wn \
                     "_mask" #mname,                                                                    \
                     attention_nax, dtype, bq, bk, bd, bv, wm, wn, mtype, float)
#define attn_dsplit(tname, dtype, bq, bk, bd, wm, wn, mname, mtype)                                         \
  instantiate_kernel("steel_attention_dsplit_" #tname "_bq" #bq "_bk" #bk "_bd" #bd "_wm" #wm "_wn" #wn     \
                     "_mask" #mname,                                                                         \
                     attention_nax_dsplit, dtype, bq, bk, bd, wm, wn, mtype, float)
#define attn_shapes(iname, itype, mname, mtype)                          \
  attn_dsplit(iname, itype, 64, 32, 256, 4, 2, mname, mtype)             \
  attn_one(iname, itype, 64, 32, 128, 128, 4, 1, mname, mtype)           \
  attn_one(iname, itype, 64, 32, 96, 96, 4, 1, mname, mtype)             \
  attn_one(iname, itype, 64, 64, 64, 64, 4, 1, mname, mtype)
#define attn_masks(iname, itype)                \
  attn_shapes(iname, itype, iname, itype)       \
  attn_shapes(iname, itype, bool_, bool)

attn_masks(float16, half)
attn_masks(bfloat16, bfloat)
attn_masks(float32, float)
attn_one(float16, half, 64, 32, 192, 128, 4, 1, float16, half)
