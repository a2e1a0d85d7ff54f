// MLX's two-output binary kernels (binary_two.h, binary_ops.h' DivMod),
// instantiated as MLX's binary_two.metal does.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/binary_ops.h"
#include "mlx/backend/metal/kernels/binary_two.h"

#define binary_base(prefix, kind, op, tname, itype, otype)                                       \
  instantiate_kernel(prefix "ss_" #op #tname, kind##_ss, itype, otype, op)                         \
  instantiate_kernel(prefix "sv_" #op #tname, kind##_sv, itype, otype, op, 1)                      \
  instantiate_kernel(prefix "vs_" #op #tname, kind##_vs, itype, otype, op, 1)                      \
  instantiate_kernel(prefix "vv_" #op #tname, kind##_vv, itype, otype, op, 1)                      \
  instantiate_kernel(prefix "sv2_" #op #tname, kind##_sv2, itype, otype, op)                       \
  instantiate_kernel(prefix "vs2_" #op #tname, kind##_vs2, itype, otype, op)                       \
  instantiate_kernel(prefix "vv2_" #op #tname, kind##_vv2, itype, otype, op)                       \
  instantiate_kernel(prefix "gn2_" #op #tname, kind##_g, itype, otype, op, 2, int)                 \
  instantiate_kernel(prefix "gn4large_" #op #tname, kind##_g, itype, otype, op, 4)                 \
  instantiate_kernel(prefix "g1_" #op #tname, kind##_g_nd1, itype, otype, op, int)                 \
  instantiate_kernel(prefix "g1large_" #op #tname, kind##_g_nd1, itype, otype, op)                 \
  instantiate_kernel(prefix "g2_" #op #tname, kind##_g_nd2, itype, otype, op, int)                 \
  instantiate_kernel(prefix "g2large_" #op #tname, kind##_g_nd2, itype, otype, op)                 \
  instantiate_kernel(prefix "g3_" #op #tname, kind##_g_nd3, itype, otype, op, int)                 \
  instantiate_kernel(prefix "g3large_" #op #tname, kind##_g_nd3, itype, otype, op)
#define binary_all(prefix, kind, op, tname, itype, otype)                                        \
  binary_base(prefix, kind, op, tname, itype, otype)                                               \
  instantiate_kernel(prefix "svn_" #op #tname, kind##_sv, itype, otype, op)                        \
  instantiate_kernel(prefix "vsn_" #op #tname, kind##_vs, itype, otype, op)                        \
  instantiate_kernel(prefix "vvn_" #op #tname, kind##_vv, itype, otype, op)

binary_all("two_", binary, DivMod, float16, half, half)
binary_all("two_", binary, DivMod, float32, float, float)
binary_all("two_", binary, DivMod, bfloat16, bfloat16_t, bfloat16_t)
binary_all("two_", binary, DivMod, int32, int32_t, int32_t)
binary_base("two_", binary, DivMod, complex64, complex64_t, complex64_t)
