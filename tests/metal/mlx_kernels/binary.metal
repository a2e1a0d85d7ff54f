// MLX's binary kernels (binary.h, binary_ops.h), instantiated as MLX's
// binary.metal does: every kernel shape for the
// floating types and a sample of the integer, bool and complex ones.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/binary_ops.h"
#include "mlx/backend/metal/kernels/binary.h"

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

#define binary_float(op)                                 \
  binary_all("", binary, op, float16, half, half)          \
  binary_all("", binary, op, float32, float, float)        \
  binary_all("", binary, op, bfloat16, bfloat16_t, bfloat16_t)
#define binary_compare(op)                               \
  binary_all("", binary, op, float16, half, bool)          \
  binary_all("", binary, op, float32, float, bool)         \
  binary_all("", binary, op, bfloat16, bfloat16_t, bool)   \
  binary_all("", binary, op, int32, int32_t, bool)         \
  binary_base("", binary, op, complex64, complex64_t, bool)

binary_float(Add)
binary_float(Divide)
binary_float(LogAddExp)
binary_float(Maximum)
binary_float(Minimum)
binary_float(Multiply)
binary_float(Subtract)
binary_float(Power)
binary_float(Remainder)
binary_float(ArcTan2)
binary_compare(Equal)
binary_compare(Greater)
binary_compare(GreaterEqual)
binary_compare(Less)
binary_compare(LessEqual)
binary_compare(NotEqual)
binary_all("", binary, NaNEqual, float16, half, bool)
binary_all("", binary, NaNEqual, float32, float, bool)
binary_all("", binary, NaNEqual, bfloat16, bfloat16_t, bool)

binary_all("", binary, Add, int32, int32_t, int32_t)
binary_all("", binary, Multiply, uint8, uint8_t, uint8_t)
binary_base("", binary, Subtract, int64, int64_t, int64_t)
binary_all("", binary, Power, int16, int16_t, int16_t)
binary_all("", binary, Remainder, int32, int32_t, int32_t)
binary_all("", binary, Add, bool_, bool, bool)
binary_base("", binary, Add, complex64, complex64_t, complex64_t)
binary_base("", binary, Multiply, complex64, complex64_t, complex64_t)
binary_base("", binary, Divide, complex64, complex64_t, complex64_t)
binary_base("", binary, Power, complex64, complex64_t, complex64_t)
binary_base("", binary, LogAddExp, complex64, complex64_t, complex64_t)
binary_all("", binary, BitwiseAnd, uint32, uint32_t, uint32_t)
binary_all("", binary, BitwiseOr, int8, int8_t, int8_t)
binary_all("", binary, BitwiseXor, uint16, uint16_t, uint16_t)
binary_all("", binary, LeftShift, int32, int32_t, int32_t)
binary_all("", binary, RightShift, uint32, uint32_t, uint32_t)
binary_all("", binary, LogicalAnd, bool_, bool, bool)
binary_all("", binary, LogicalOr, bool_, bool, bool)

