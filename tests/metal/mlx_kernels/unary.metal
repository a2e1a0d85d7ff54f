// MLX's unary kernels (unary.h, unary_ops.h, erf.h, expm1f.h, cexpf.h,
// fp8.h), instantiated as MLX's unary.metal does: each kernel shape for the
// floating types and a sample of the integer, bool and complex ones.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/unary_ops.h"
#include "mlx/backend/metal/kernels/unary.h"

// 8-byte types have one element per thread: no separate vn_ kernel.
#define unary_base(op, tname, in_t, out_t)                                            \
  instantiate_kernel("v_" #op #tname, unary_v, in_t, out_t, op, 1)                      \
  instantiate_kernel("v2_" #op #tname, unary_v2, in_t, out_t, op)                       \
  instantiate_kernel("gn1_" #op #tname, unary_g, in_t, out_t, op, 1, int)               \
  instantiate_kernel("gn4large_" #op #tname, unary_g, in_t, out_t, op, 4)
#define unary_shapes(op, tname, in_t, out_t)                                          \
  unary_base(op, tname, in_t, out_t)                                                    \
  instantiate_kernel("vn_" #op #tname, unary_v, in_t, out_t, op)

#define unary_float(op)                 \
  unary_shapes(op, float32, float, float) \
  unary_shapes(op, float16, half, half)   \
  unary_shapes(op, bfloat16, bfloat16_t, bfloat16_t)

unary_float(Abs)
unary_float(ArcCos)
unary_float(ArcCosh)
unary_float(ArcSin)
unary_float(ArcSinh)
unary_float(ArcTan)
unary_float(ArcTanh)
unary_float(Ceil)
unary_float(Cos)
unary_float(Cosh)
unary_float(Exp)
unary_float(Expm1)
unary_float(Floor)
unary_float(Log)
unary_float(Log2)
unary_float(Log10)
unary_float(Log1p)
unary_float(Negative)
unary_float(Sigmoid)
unary_float(Erf)
unary_float(ErfInv)
unary_float(Sign)
unary_float(Sin)
unary_float(Sinh)
unary_float(Square)
unary_float(Sqrt)
unary_float(Rsqrt)
unary_float(Tan)
unary_float(Tanh)
unary_float(Round)

unary_shapes(Abs, int32, int32_t, int32_t)
unary_shapes(Abs, uint8, uint8_t, uint8_t)
unary_base(Negative, int64, int64_t, int64_t)
unary_shapes(Sign, int16, int16_t, int16_t)
unary_shapes(Floor, uint32, uint32_t, uint32_t)
unary_shapes(BitwiseInvert, uint16, uint16_t, uint16_t)
unary_shapes(BitwiseInvert, int8, int8_t, int8_t)
unary_shapes(LogicalNot, bool_, bool, bool)
unary_shapes(Abs, bool_, bool, bool)

unary_base(Abs, complex64, complex64_t, complex64_t)
unary_base(Exp, complex64, complex64_t, complex64_t)
unary_base(Log1p, complex64, complex64_t, complex64_t)
unary_base(Sqrt, complex64, complex64_t, complex64_t)
unary_base(Tanh, complex64, complex64_t, complex64_t)
unary_base(Sign, complex64, complex64_t, complex64_t)
unary_base(Conjugate, complex64, complex64_t, complex64_t)
unary_base(Real, complex64float32, complex64_t, float)
unary_base(Imag, complex64float32, complex64_t, float)

unary_shapes(ToFP8, float32uint8, float, uint8_t)
unary_shapes(ToFP8, float16uint8, half, uint8_t)
unary_shapes(ToFP8, bfloat16uint8, bfloat16_t, uint8_t)
unary_shapes(FromFP8, uint8float32, uint8_t, float)
unary_shapes(FromFP8, uint8float16, uint8_t, half)
unary_shapes(FromFP8, uint8bfloat16, uint8_t, bfloat16_t)
