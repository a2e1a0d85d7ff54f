// Sorted fp16 implicit GEMM on Metal 4 TensorOps (the neural-accelerator
// tier): the plan, tiles and write-back of sorted_gemm.metal, with each
// offset's product done by a MetalPerformancePrimitives matmul2d shared by
// the four simdgroups of a threadgroup. Row-stationary: one threadgroup owns
// 64 sorted output rows; their 64 x C float accumulator stays in a
// cooperative tensor (registers) across every offset of the tile's mask and
// is written once, in public row order. Programs: src/metal/tensorops_sorted.cpp.
//
// Compiled only as Metal 4.0 (inline tensor ops need it): CMake builds this
// file into its own mlx_lattice_tensorops.metallib with -std=metal4.0 when
// the SDK supports it, and for older language versions the file is empty.
#include <metal_stdlib>

#include "params.h"

#if __METAL_VERSION__ >= 400
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>

using namespace metal;

constexpr constant int kTensorTileRows = 64;

// x: (n_in, C) fp16; w: (27, C, C) contiguous fp16 (W[k] is C_in x C_out,
// row-major); the sorted plan as in sorted_gemm.metal. w is declared
// without const: tensor views wrap mutable element types.
template <int C>
[[kernel]] void tensorops_sorted(
    device const half* x [[buffer(0)]],
    device half* w [[buffer(1)]],
    device const int* reorder [[buffer(2)]],
    device const int* sorted_map [[buffer(3)]],
    device const ulong* tile_masks [[buffer(4)]],
    device half* y [[buffer(5)]],
    constant ConvParams& p [[buffer(6)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]]) {
  // 8 KiB of gathered rows (one offset at a time) and 16 KiB for the
  // finished tile at C = 64.
  threadgroup half xs[kTensorTileRows * C];
  threadgroup float ys[kTensorTileRows * C];
  const int tile = int(gid.x);
  const int t = int(lid);
  const int row0 = tile * kTensorTileRows;
  const ulong mask = tile_masks[tile];

  // (64 x C) += (64 x C) * (C x C), products summed in float.
  constexpr auto desc = mpp::tensor_ops::matmul2d_descriptor(
      kTensorTileRows, C, C, false, false, false,
      mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
  mpp::tensor_ops::matmul2d<desc, execution_simdgroups<4>> op;
  // Row-major matrices are tensors of extents (columns, rows).
  auto xt = tensor<threadgroup half, dextents<int32_t, 2>, tensor_inline>(
      xs, dextents<int32_t, 2>(C, kTensorTileRows));
  auto w0 = tensor<device half, dextents<int32_t, 2>, tensor_inline>(w, dextents<int32_t, 2>(C, C));
  auto acc = op.template get_destination_cooperative_tensor<decltype(xt), decltype(w0), float>();
  for (int i = 0; i < int(acc.get_capacity()); ++i) {
    acc[i] = 0.0f;
  }

  for (int k = 0; k < p.k; ++k) {
    if (((mask >> k) & 1) == 0) {
      continue; // no row of this tile has offset k (uniform in the group)
    }
    threadgroup_barrier(mem_flags::mem_threadgroup); // the last run is done with xs
    for (int i = t; i < kTensorTileRows * C; i += 128) {
      const int row = row0 + i / C;
      const int in = row < p.rows ? sorted_map[long(row) * p.k + k] : -1;
      xs[i] = in >= 0 ? x[long(in) * C + i % C] : half(0.0f);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    auto wk = tensor<device half, dextents<int32_t, 2>, tensor_inline>(
        w + long(k) * C * C, dextents<int32_t, 2>(C, C));
    op.run(xt, wk, acc);
  }

  auto yt = tensor<threadgroup float, dextents<int32_t, 2>, tensor_inline>(
      ys, dextents<int32_t, 2>(C, kTensorTileRows));
  acc.store(yt);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int i = t; i < kTensorTileRows * C; i += 128) {
    const int row = row0 + i / C;
    if (row < p.rows) {
      y[long(reorder[row]) * C + i % C] = half(ys[i]);
    }
  }
}

template [[host_name("tensorops_sorted_float16_c32")]] [[kernel]] decltype(tensorops_sorted<32>) tensorops_sorted<32>;
template [[host_name("tensorops_sorted_float16_c64")]] [[kernel]] decltype(tensorops_sorted<64>) tensorops_sorted<64>;

#endif // __METAL_VERSION__ >= 400
