// MLX's sort and searchsorted kernels (sort.h, searchsorted.h), as MLX's
// sort.metal and searchsorted.metal instantiate them (block sizes from 32
// to 512, the multi-block sort at 512 and 256).
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/sort.h"
#include "mlx/backend/metal/kernels/searchsorted.h"

#define block_sort_(name, itname, itype, otname, otype, arg_sort, bn, tn)            \
  instantiate_kernel("c" #name "_" #itname "_" #otname "_bn" #bn "_tn" #tn,          \
                     block_sort, itype, otype, arg_sort, bn, tn)                      \
  instantiate_kernel("nc" #name "_" #itname "_" #otname "_bn" #bn "_tn" #tn,         \
                     block_sort_nc, itype, otype, arg_sort, bn, tn)
#define block_sort_both(itname, itype, bn)                                            \
  block_sort_(_block_sort, itname, itype, itname, itype, false, bn, 4)                 \
  block_sort_(arg_block_sort, itname, itype, uint32, uint32_t, true, bn, 4)
#define block_sort_sizes(itname, itype)   \
  block_sort_both(itname, itype, 32)      \
  block_sort_both(itname, itype, 64)      \
  block_sort_both(itname, itype, 128)     \
  block_sort_both(itname, itype, 256)     \
  block_sort_both(itname, itype, 512)
#define multi_block(vtname, vtype, bn)                                                        \
  instantiate_kernel("sort_mbsort_" #vtname "_uint32_bn" #bn "_tn4", mb_block_sort, vtype,      \
                     uint32_t, true, bn, 4)                                                     \
  instantiate_kernel("partition_mbsort_" #vtname "_uint32_bn" #bn "_tn4", mb_block_partition,   \
                     vtype, uint32_t, true, bn, 4)                                              \
  instantiate_kernel("merge_mbsort_" #vtname "_uint32_bn" #bn "_tn4", mb_block_merge, vtype,    \
                     uint32_t, true, bn, 4)
#define searchsorted_type(tname, type)                                                \
  instantiate_kernel("searchsorted_" #tname "_left", searchsorted, type, false)       \
  instantiate_kernel("searchsorted_" #tname "_right", searchsorted, type, true)

block_sort_sizes(float32, float)
block_sort_sizes(float16, half)
block_sort_sizes(bfloat16, bfloat16_t)
block_sort_sizes(int32, int32_t)
block_sort_both(uint8, uint8_t, 128)
block_sort_both(int64, int64_t, 256)
block_sort_both(complex64, complex64_t, 128)
multi_block(float32, float, 512)
multi_block(float16, half, 512)
multi_block(bfloat16, bfloat16_t, 512)
multi_block(int64, int64_t, 256)
multi_block(complex64, complex64_t, 256)
searchsorted_type(float32, float)
searchsorted_type(float16, half)
searchsorted_type(bfloat16, bfloat16_t)
searchsorted_type(int32, int32_t)
searchsorted_type(bool_, bool)
searchsorted_type(uint64, uint64_t)
searchsorted_type(complex64, complex64_t)
