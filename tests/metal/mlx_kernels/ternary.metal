// MLX's ternary kernels (ternary.h, ternary_ops.h), instantiated as MLX's
// ternary.metal does.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/ternary_ops.h"
#include "mlx/backend/metal/kernels/ternary.h"

#define ternary_base(op, tname, type)                                        \
  instantiate_kernel("v_" #op #tname, ternary_v, type, op, false, false, 1)  \
  instantiate_kernel("v2_" #op #tname, ternary_v2, type, op, false, false)   \
  instantiate_kernel("vs_" #op #tname, ternary_v, type, op, false, true, 1)  \
  instantiate_kernel("vs2_" #op #tname, ternary_v2, type, op, false, true)   \
  instantiate_kernel("sv_" #op #tname, ternary_v, type, op, true, false, 1)  \
  instantiate_kernel("sv2_" #op #tname, ternary_v2, type, op, true, false)   \
  instantiate_kernel("gn2_" #op #tname, ternary_g, type, op, 2, int)         \
  instantiate_kernel("g1_" #op #tname, ternary_g_nd1, type, op, int)         \
  instantiate_kernel("g2_" #op #tname, ternary_g_nd2, type, op, int)         \
  instantiate_kernel("g3_" #op #tname, ternary_g_nd3, type, op, int)         \
  instantiate_kernel("g1large_" #op #tname, ternary_g_nd1, type, op)         \
  instantiate_kernel("g2large_" #op #tname, ternary_g_nd2, type, op)         \
  instantiate_kernel("g3large_" #op #tname, ternary_g_nd3, type, op)         \
  instantiate_kernel("gn4large_" #op #tname, ternary_g, type, op, 4)
#define ternary_all(op, tname, type)                                         \
  instantiate_kernel("vn_" #op #tname, ternary_v, type, op, false, false)    \
  instantiate_kernel("vsn_" #op #tname, ternary_v, type, op, false, true)    \
  instantiate_kernel("svn_" #op #tname, ternary_v, type, op, true, false)    \
  ternary_base(op, tname, type)

ternary_all(Select, bool_, bool)
ternary_all(Select, uint8, uint8_t)
ternary_all(Select, int32, int32_t)
ternary_base(Select, int64, int64_t)
ternary_all(Select, float16, half)
ternary_all(Select, float32, float)
ternary_all(Select, bfloat16, bfloat16_t)
ternary_base(Select, complex64, complex64_t)
