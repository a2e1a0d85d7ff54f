// MLX's indexing kernels (indexing/*.h, with atomic.h and reduction/ops.h
// for the scatter reductions): gather and scatter wrapped in kernels the way
// MLX's JIT source does (index buffers from buffer 20), gather_axis,
// gather_front, scatter_axis, masked_assign and slice_update for a sample of
// value, index and reduction types.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/atomic.h"
#include "mlx/backend/metal/kernels/reduction/ops.h"
#include "mlx/backend/metal/kernels/indexing/gather.h"
#include "mlx/backend/metal/kernels/indexing/gather_axis.h"
#include "mlx/backend/metal/kernels/indexing/gather_front.h"
#include "mlx/backend/metal/kernels/indexing/scatter.h"
#include "mlx/backend/metal/kernels/indexing/scatter_axis.h"
#include "mlx/backend/metal/kernels/indexing/masked_scatter.h"

// Two index arrays of int32, one-dimensional.
#define gather2(tname, T, LocT)                                                     \
  [[kernel]] void gather_##tname##_i32_2_##LocT(                                     \
      const device T* src [[buffer(0)]], device T* out [[buffer(1)]],                \
      const constant int* src_shape [[buffer(2)]],                                   \
      const constant int64_t* src_strides [[buffer(3)]],                             \
      const constant size_t& src_ndim [[buffer(4)]],                                 \
      const constant int* slice_sizes [[buffer(5)]],                                 \
      const constant int* axes [[buffer(6)]],                                        \
      const constant int* idx_shapes [[buffer(7)]],                                  \
      const constant int64_t* idx_strides [[buffer(8)]],                             \
      const constant bool* idx_contigs [[buffer(9)]],                                \
      const constant int& idx_ndim [[buffer(10)]],                                   \
      const device int32_t* idx0 [[buffer(20)]],                                     \
      const device int32_t* idx1 [[buffer(21)]],                                     \
      uint3 index [[thread_position_in_grid]],                                       \
      uint3 grid_dim [[threads_per_grid]]) {                                         \
    Indices<int32_t, 2> idxs{{{idx0, idx1}}, idx_shapes, idx_strides, idx_contigs, idx_ndim}; \
    gather_impl<T, int32_t, 2, 1, LocT>(src, out, src_shape, src_strides, src_ndim, \
                                        slice_sizes, axes, idxs, index, grid_dim);  \
  }

#define scatter1(tname, T, oname, op)                                               \
  [[kernel]] void scatter_##tname##_##oname(                                            \
      const device T* updates [[buffer(1)]],                                         \
      device mlx_atomic<T>* out [[buffer(2)]],                                       \
      const constant int* upd_shape [[buffer(3)]],                                   \
      const constant int64_t* upd_strides [[buffer(4)]],                             \
      const constant size_t& upd_ndim [[buffer(5)]],                                 \
      const constant size_t& upd_size [[buffer(6)]],                                 \
      const constant int* out_shape [[buffer(7)]],                                   \
      const constant int64_t* out_strides [[buffer(8)]],                             \
      const constant size_t& out_ndim [[buffer(9)]],                                 \
      const constant int* axes [[buffer(10)]],                                       \
      const constant int* idx_shapes [[buffer(11)]],                                 \
      const constant int64_t* idx_strides [[buffer(12)]],                            \
      const constant bool* idx_contigs [[buffer(13)]],                               \
      const constant int& idx_ndim [[buffer(14)]],                                   \
      const constant size_t& idx_size [[buffer(15)]],                                \
      const device int32_t* idx0 [[buffer(20)]],                                     \
      uint2 gid [[thread_position_in_grid]]) {                                       \
    Indices<int32_t, 1> idxs{{{idx0}}, idx_shapes, idx_strides, idx_contigs, idx_ndim}; \
    scatter_impl<T, int32_t, op, 1, true, 1, int64_t>(                              \
        updates, out, upd_shape, upd_strides, upd_ndim, upd_size, out_shape,        \
        out_strides, out_ndim, axes, idx_size, idxs, gid);                          \
  }

gather2(float32, float, int)
gather2(float16, half, int64_t)
gather2(bfloat16, bfloat16_t, int)
gather2(int64, int64_t, int)
scatter1(float32, float, none, None)
scatter1(float32, float, sum, Sum<float>)
scatter1(float16, half, max, Max<half>)
scatter1(bfloat16, bfloat16_t, prod, Prod<bfloat16_t>)
scatter1(int32, int32_t, min, Min<int32_t>)

#define axis_kernels(tname, T, iname, IdxT)                                                      \
  instantiate_kernel("gather_axis" #tname #iname "_sc_ic", gather_axis, T, IdxT, int, true, true)  \
  instantiate_kernel("gather_axis" #tname #iname "_large", gather_axis, T, IdxT, int64_t, false, false) \
  instantiate_kernel("gather_front" #tname #iname, gather_front, T, IdxT, int, 2)                  \
  instantiate_kernel("scatter_axis" #tname #iname "_none", scatter_axis, T, IdxT, int, None, true, true) \
  instantiate_kernel("scatter_axis" #tname #iname "_sum", scatter_axis, T, IdxT, int64_t, Sum<T>, false, false)

axis_kernels(float32, float, int32, int32_t)
axis_kernels(float16, half, uint32, uint32_t)
axis_kernels(bfloat16, bfloat16_t, int64, int64_t)

instantiate_kernel("masked_assign_float32_c", masked_assign_impl, float, true)
instantiate_kernel("masked_assign_float16_s", masked_assign_impl, half, false)
instantiate_kernel("masked_assign_bfloat16_c", masked_assign_impl, bfloat16_t, true)

#define slice_update(tname, T, oname, op, oc, uc, us, nwork, ndim)                                   \
  instantiate_kernel("slice_update_" #tname "_" #oname #oc #uc #us #nwork #ndim, slice_update_op_impl, \
                     T, int32_t, op, oc, uc, us, nwork, ndim)
slice_update(float32, float, sum, Sum<float>, true, true, false, 1, 1)
slice_update(float16, half, sum, Sum<half>, false, true, false, 2, 2)
slice_update(bfloat16, bfloat16_t, max, Max<bfloat16_t>, false, false, true, 4, 0)
