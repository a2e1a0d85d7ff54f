// MLX's reductions (reduce.h, reduce_utils.h, reduction/*.h, atomic.h),
// instantiated as MLX's reduce.metal does: every kernel for the floating
// types and a sample of the integer, bool and complex ones.
#include "mlx/backend/metal/kernels/defines.h"
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/atomic.h"
#include "mlx/backend/metal/kernels/reduction/ops.h"
#include "mlx/backend/metal/kernels/reduce.h"
#include "mlx/backend/metal/kernels/reduce_utils.h"

#define init_reduce(name, tname, type, op) \
  instantiate_kernel("init_reduce_" #name #tname, init_reduce, type, op<type>)

#define col_small(name, itype, otype, op, dim)                                          \
  instantiate_kernel("col_reduce_small_" #dim "_reduce_" #name, col_reduce_small,          \
                     itype, otype, op, int, dim)                                         \
  instantiate_kernel("col_reduce_longcolumn_" #dim "_reduce_" #name, col_reduce_longcolumn, \
                     itype, otype, op, int, dim)                                         \
  instantiate_kernel("col_reduce_small_large_" #dim "_reduce_" #name, col_reduce_small,    \
                     itype, otype, op, int64_t, dim)
#define col_looped(name, itype, otype, op, dim)                                             \
  instantiate_kernel("col_reduce_looped_" #dim "_32_32_reduce_" #name, col_reduce_looped,    \
                     itype, otype, op, int, dim, 32, 32)                                     \
  instantiate_kernel("col_reduce_2pass_" #dim "_32_32_reduce_" #name, col_reduce_2pass,      \
                     itype, otype, op, int, dim, 32, 32)                                     \
  instantiate_kernel("col_reduce_2pass_large_" #dim "_32_32_reduce_" #name, col_reduce_2pass, \
                     itype, otype, op, int64_t, dim, 32, 32)
#define row_small(name, itype, otype, op, dim)                                           \
  instantiate_kernel("row_reduce_small_" #dim "_reduce_" #name, row_reduce_small,           \
                     itype, otype, op, int, dim)                                          \
  instantiate_kernel("row_reduce_looped_" #dim "_reduce_" #name, row_reduce_looped,         \
                     itype, otype, op, int, dim)                                          \
  instantiate_kernel("row_reduce_looped_large_" #dim "_reduce_" #name, row_reduce_looped,   \
                     itype, otype, op, int64_t, dim)
#define reduce_functions(name, itype, otype, op)                                           \
  instantiate_kernel("all_reduce_" #name, all_reduce, itype, otype, op<otype>)              \
  instantiate_kernel("row_reduce_simple_" #name, row_reduce_simple, itype, otype, op<otype>) \
  row_small(name, itype, otype, op<otype>, 1)                                                \
  row_small(name, itype, otype, op<otype>, 2)                                                \
  row_small(name, itype, otype, op<otype>, 5)                                                \
  col_small(name, itype, otype, op<otype>, 1)                                                \
  col_small(name, itype, otype, op<otype>, 5)                                                \
  col_looped(name, itype, otype, op<otype>, 2)                                               \
  col_looped(name, itype, otype, op<otype>, 5)

init_reduce(sum, float32, float, Sum)
init_reduce(sum, float16, float16_t, Sum)
init_reduce(sum, bfloat16, bfloat16_t, Sum)
init_reduce(prod, complex64, complex64_t, Prod)
init_reduce(min, bfloat16, bfloat16_t, Min)
init_reduce(max, uint64, uint64_t, Max)
init_reduce(and, bool_, bool, And)
init_reduce(or, bool_, bool, Or)

reduce_functions(sumfloat32, float, float, Sum)
reduce_functions(sumfloat16, float16_t, float16_t, Sum)
reduce_functions(sumbfloat16, bfloat16_t, bfloat16_t, Sum)
reduce_functions(prodfloat32, float, float, Prod)
reduce_functions(prodbfloat16, bfloat16_t, bfloat16_t, Prod)
reduce_functions(minfloat16, float16_t, float16_t, Min)
reduce_functions(minbfloat16, bfloat16_t, bfloat16_t, Min)
reduce_functions(maxfloat32, float, float, Max)
reduce_functions(maxbfloat16, bfloat16_t, bfloat16_t, Max)
reduce_functions(anduint32, uint32_t, bool, And)
reduce_functions(orfloat32, float, bool, Or)
reduce_functions(sumuint8, uint8_t, int32_t, Sum)
reduce_functions(sumint64, int64_t, int64_t, Sum)
reduce_functions(maxint8, int8_t, int8_t, Max)
reduce_functions(minuint64, uint64_t, uint64_t, Min)
reduce_functions(sumcomplex64, complex64_t, complex64_t, Sum)
reduce_functions(maxcomplex64, complex64_t, complex64_t, Max)
