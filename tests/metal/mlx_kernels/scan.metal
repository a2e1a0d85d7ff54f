// MLX's scan kernels (scan.h), instantiated as MLX's scan.metal does, for
// each reduction and a range of input and output types.
#include "mlx/backend/metal/kernels/defines.h"
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/scan.h"

#define contiguous(name, itype, otype, op, inclusive, reverse, nreads)  \
  template [[host_name("contig_scan_" #name)]] [[kernel]] void          \
  contiguous_scan<itype, otype, op<otype>, nreads, inclusive, reverse>( \
      const device itype* in [[buffer(0)]],                             \
      device otype* out [[buffer(1)]],                                  \
      const constant size_t& axis_size [[buffer(2)]],                   \
      uint3 gid [[threadgroup_position_in_grid]],                       \
      uint3 gsize [[threadgroups_per_grid]],                            \
      uint3 lid [[thread_position_in_threadgroup]],                     \
      uint3 lsize [[threads_per_threadgroup]],                          \
      uint simd_lane_id [[thread_index_in_simdgroup]],                  \
      uint simd_group_id [[simdgroup_index_in_threadgroup]]);
#define strided(name, itype, otype, op, inclusive, reverse, nreads)  \
  template [[host_name("strided_scan_" #name)]] [[kernel]] void      \
  strided_scan<itype, otype, op<otype>, nreads, inclusive, reverse>( \
      const device itype* in [[buffer(0)]],                          \
      device otype* out [[buffer(1)]],                               \
      const constant size_t& axis_size [[buffer(2)]],                \
      const constant size_t& stride [[buffer(3)]],                   \
      const constant size_t& stride_blocks [[buffer(4)]],            \
      uint3 gid [[threadgroup_position_in_grid]],                    \
      uint3 gsize [[threadgroups_per_grid]],                         \
      uint3 lid [[thread_position_in_threadgroup]],                  \
      uint simd_lane_id [[thread_index_in_simdgroup]],               \
      uint simd_group_id [[simdgroup_index_in_threadgroup]]);
#define scan_all(name, itype, otype, op, nreads)                                         \
  contiguous(inclusive_##name, itype, otype, op, true, false, nreads)                     \
  contiguous(exclusive_##name, itype, otype, op, false, false, nreads)                    \
  contiguous(reverse_inclusive_##name, itype, otype, op, true, true, nreads)              \
  contiguous(reverse_exclusive_##name, itype, otype, op, false, true, nreads)             \
  strided(inclusive_##name, itype, otype, op, true, false, nreads)                        \
  strided(exclusive_##name, itype, otype, op, false, false, nreads)                       \
  strided(reverse_inclusive_##name, itype, otype, op, true, true, nreads)                 \
  strided(reverse_exclusive_##name, itype, otype, op, false, true, nreads)

scan_all(sum_bool__int32, bool, int32_t, CumSum, 4)
scan_all(sum_int32_int32, int32_t, int32_t, CumSum, 4)
scan_all(sum_int64_int64, int64_t, int64_t, CumSum, 2)
scan_all(sum_float16_float16, half, half, CumSum, 4)
scan_all(sum_float32_float32, float, float, CumSum, 4)
scan_all(sum_bfloat16_bfloat16, bfloat16_t, bfloat16_t, CumSum, 4)
scan_all(sum_complex64_complex64, complex64_t, complex64_t, CumSum, 2)
scan_all(prod_float32_float32, float, float, CumProd, 4)
scan_all(prod_bfloat16_bfloat16, bfloat16_t, bfloat16_t, CumProd, 4)
scan_all(prod_uint8_uint8, uint8_t, uint8_t, CumProd, 4)
scan_all(max_float16_float16, half, half, CumMax, 4)
scan_all(max_float32_float32, float, float, CumMax, 4)
scan_all(max_bool__bool_, bool, bool, CumMax, 4)
scan_all(min_bfloat16_bfloat16, bfloat16_t, bfloat16_t, CumMin, 4)
scan_all(min_int16_int16, int16_t, int16_t, CumMin, 4)
scan_all(logaddexp_float32_float32, float, float, CumLogaddexp, 4)
scan_all(logaddexp_float16_float16, half, half, CumLogaddexp, 4)
scan_all(logaddexp_bfloat16_bfloat16, bfloat16_t, bfloat16_t, CumLogaddexp, 4)
