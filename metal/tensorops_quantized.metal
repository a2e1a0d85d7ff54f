// TensorOps quantized contraction (fp16 features, int4/int8 codes, one
// scale and bias per (output channel, offset): group_size == C_in) on the
// sorted plan: per offset in a 64-row tile's mask, W[k] is dequantized into
// a temporary fp16 tile in threadgroup memory and one MetalPerformance-
// Primitives matmul2d over four simdgroups accumulates into a cooperative
// tensor; the tile is written once, in public row order.
// Programs: src/metal/tensorops_quantized.cpp. Compiled only as Metal 4.0, into
// mlx_lattice_tensorops.metallib (see tensorops_sorted.metal).
#include <metal_stdlib>

#include "quant_params.h"

#if __METAL_VERSION__ >= 400
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>

using namespace metal;

constexpr constant int kQuantTileRows = 64;

template <int CI, int CO, int BITS>
[[kernel]] void tensorops_quantized(
    device const half* x [[buffer(0)]],
    device const uint* codes [[buffer(1)]],
    device const float* scales [[buffer(2)]],
    device const float* biases [[buffer(3)]],
    device const int* reorder [[buffer(4)]],
    device const int* sorted_map [[buffer(5)]],
    device const ulong* tile_masks [[buffer(6)]],
    device half* y [[buffer(7)]],
    constant QuantParams& p [[buffer(8)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]]) {
  // 16 KiB: gathered rows (64 x CI) and W[k] (CI x CO) in fp16 while
  // accumulating; then the finished 64 x CO tile in fp32, the cooperative
  // tensor's type (a store does not convert), over the same storage.
  threadgroup float smem[kQuantTileRows * 64];
  threadgroup half* xs = reinterpret_cast<threadgroup half*>(smem);
  threadgroup half* ws = xs + kQuantTileRows * CI;
  const int tile = int(gid.x);
  const int t = int(lid);
  const int row0 = tile * kQuantTileRows;
  const ulong mask = tile_masks[tile];

  constexpr auto desc = mpp::tensor_ops::matmul2d_descriptor(
      kQuantTileRows, CO, CI, false, false, false,
      mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
  mpp::tensor_ops::matmul2d<desc, execution_simdgroups<4>> op;
  auto xt = tensor<threadgroup half, dextents<int32_t, 2>, tensor_inline>(
      xs, dextents<int32_t, 2>(CI, kQuantTileRows));
  auto wt = tensor<threadgroup half, dextents<int32_t, 2>, tensor_inline>(
      ws, dextents<int32_t, 2>(CO, CI));
  auto acc = op.template get_destination_cooperative_tensor<decltype(xt), decltype(wt), float>();
  for (int i = 0; i < int(acc.get_capacity()); ++i) {
    acc[i] = 0.0f;
  }
  for (int k = 0; k < p.k; ++k) {
    if (((mask >> k) & 1) == 0) {
      continue; // no row of this tile has offset k (uniform in the group)
    }
    threadgroup_barrier(mem_flags::mem_threadgroup); // the last run is done
    for (int i = t; i < kQuantTileRows * CI; i += 128) {
      const int row = row0 + i / CI;
      const int in = row < p.rows ? sorted_map[long(row) * p.k + k] : -1;
      xs[i] = in >= 0 ? x[long(in) * CI + i % CI] : half(0.0f);
    }
    for (int i = t; i < CI * CO; i += 128) {
      ws[i] = half(quant_weight<BITS>(codes, scales, biases, p, i % CO, k, i / CO));
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    op.run(xt, wt, acc);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  auto yt = tensor<threadgroup float, dextents<int32_t, 2>, tensor_inline>(
      smem, dextents<int32_t, 2>(CO, kQuantTileRows));
  acc.store(yt);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int i = t; i < kQuantTileRows * CO; i += 128) {
    const int row = row0 + i / CO;
    if (row < p.rows) {
      y[long(reorder[row]) * CO + i % CO] = half(smem[i]); // fp32 -> fp16 on write-back
    }
  }
}

template [[host_name("tensorops_quantized_float16_32x32_int4")]] [[kernel]] decltype(tensorops_quantized<32, 32, 4>) tensorops_quantized<32, 32, 4>;
template [[host_name("tensorops_quantized_float16_32x32_int8")]] [[kernel]] decltype(tensorops_quantized<32, 32, 8>) tensorops_quantized<32, 32, 8>;
template [[host_name("tensorops_quantized_float16_32x64_int4")]] [[kernel]] decltype(tensorops_quantized<32, 64, 4>) tensorops_quantized<32, 64, 4>;
template [[host_name("tensorops_quantized_float16_32x64_int8")]] [[kernel]] decltype(tensorops_quantized<32, 64, 8>) tensorops_quantized<32, 64, 8>;
template [[host_name("tensorops_quantized_float16_64x32_int4")]] [[kernel]] decltype(tensorops_quantized<64, 32, 4>) tensorops_quantized<64, 32, 4>;
template [[host_name("tensorops_quantized_float16_64x32_int8")]] [[kernel]] decltype(tensorops_quantized<64, 32, 8>) tensorops_quantized<64, 32, 8>;
template [[host_name("tensorops_quantized_float16_64x64_int4")]] [[kernel]] decltype(tensorops_quantized<64, 64, 4>) tensorops_quantized<64, 64, 4>;
template [[host_name("tensorops_quantized_float16_64x64_int8")]] [[kernel]] decltype(tensorops_quantized<64, 64, 8>) tensorops_quantized<64, 64, 8>;

#endif // __METAL_VERSION__ >= 400
