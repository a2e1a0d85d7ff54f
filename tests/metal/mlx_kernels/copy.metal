// MLX's copy kernels (copy.h), instantiated as MLX's copy.metal does, for
// the floating types among themselves and a sample of the others.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/copy.h"

#define copy_base(tname, itype, otype)                                  \
  instantiate_kernel("s_copy" #tname, copy_s, itype, otype, 1)          \
  instantiate_kernel("v_copy" #tname, copy_v, itype, otype, 1)          \
  instantiate_kernel("s2_copy" #tname, copy_s2, itype, otype)           \
  instantiate_kernel("v2_copy" #tname, copy_v2, itype, otype)           \
  instantiate_kernel("g1_copy" #tname, copy_g_nd1, itype, otype, int)   \
  instantiate_kernel("g2_copy" #tname, copy_g_nd2, itype, otype, int)   \
  instantiate_kernel("g3_copy" #tname, copy_g_nd3, itype, otype, int)   \
  instantiate_kernel("gn2_copy" #tname, copy_g, itype, otype, 2, int)   \
  instantiate_kernel("g1large_copy" #tname, copy_g_nd1, itype, otype)   \
  instantiate_kernel("g2large_copy" #tname, copy_g_nd2, itype, otype)   \
  instantiate_kernel("g3large_copy" #tname, copy_g_nd3, itype, otype)   \
  instantiate_kernel("gn4large_copy" #tname, copy_g, itype, otype, 4)
#define copy_all(tname, itype, otype)                                   \
  copy_base(tname, itype, otype)                                        \
  instantiate_kernel("sn_copy" #tname, copy_s, itype, otype)            \
  instantiate_kernel("vn_copy" #tname, copy_v, itype, otype)
#define copy_same(tname, type)                                                          \
  instantiate_kernel("gg1_copy" #tname, copy_gg_nd1, type, type, int)                   \
  instantiate_kernel("gg2_copy" #tname, copy_gg_nd2, type, type, int)                   \
  instantiate_kernel("gg3_copy" #tname, copy_gg_nd3, type, type, int)                   \
  instantiate_kernel("ggn2_copy" #tname, copy_gg, type, type, 2, int)                   \
  instantiate_kernel("gg1large_copy" #tname, copy_gg_nd1, type, type)                   \
  instantiate_kernel("gg2large_copy" #tname, copy_gg_nd2, type, type)                   \
  instantiate_kernel("gg3large_copy" #tname, copy_gg_nd3, type, type)                   \
  instantiate_kernel("ggn4large_copy" #tname, copy_gg, type, type, 4)                   \
  instantiate_kernel("gg1_dynamic_copy" #tname, copy_gg_dynamic_nd1, type, type, int)   \
  instantiate_kernel("gg2_dynamic_copy" #tname, copy_gg_dynamic_nd2, type, type, int)   \
  instantiate_kernel("gg3_dynamic_copy" #tname, copy_gg_dynamic_nd3, type, type, int)   \
  instantiate_kernel("ggn2_dynamic_copy" #tname, copy_gg_dynamic, type, type, 2, int)   \
  instantiate_kernel("gg1large_dynamic_copy" #tname, copy_gg_dynamic_nd1, type, type)   \
  instantiate_kernel("gg2large_dynamic_copy" #tname, copy_gg_dynamic_nd2, type, type)   \
  instantiate_kernel("gg3large_dynamic_copy" #tname, copy_gg_dynamic_nd3, type, type)   \
  instantiate_kernel("ggn4large_dynamic_copy" #tname, copy_gg_dynamic, type, type, 4)

#define copy_from(itname, itype)                       \
  copy_same(itname##itname, itype)                     \
  copy_all(itname##float32, itype, float)              \
  copy_all(itname##float16, itype, half)               \
  copy_all(itname##bfloat16, itype, bfloat16_t)        \
  copy_all(itname##int32, itype, int32_t)              \
  copy_all(itname##bool_, itype, bool)                 \
  copy_base(itname##int64, itype, int64_t)             \
  copy_base(itname##complex64, itype, complex64_t)

copy_from(float32, float)
copy_from(float16, half)
copy_from(bfloat16, bfloat16_t)
copy_all(int32float32, int32_t, float)
copy_all(uint8bfloat16, uint8_t, bfloat16_t)
copy_base(int64float16, int64_t, half)
copy_same(complex64complex64, complex64_t)
copy_base(complex64float32, complex64_t, float)
