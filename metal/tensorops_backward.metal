// Backward routes on Metal 4 TensorOps (the neural-accelerator tier):
//  - the input gradient for C_in = C_out = 16 in float32: 64 input rows per
//    threadgroup, one matmul2d per offset over the input-major neighbour
//    map, the accumulator held in a cooperative tensor;
//  - the weight gradient as a partitioned contraction: threadgroup (p, k)
//    sums x[g]^T ct[r] over chunks p, p + P, p + 2P, ... of offset k's
//    kernel-major edges into a float partial, and wgrad_reduce
//    (backward.metal, in mlx_lattice.metallib) adds the P partials of each
//    offset in order.
// Programs: src/metal/tensorops_backward.cpp. Compiled only as Metal 4.0, into
// mlx_lattice_tensorops.metallib (see tensorops_sorted.metal).
#include <metal_stdlib>

#include "params.h"

#if __METAL_VERSION__ >= 400
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>

using namespace metal;

constexpr constant int kDgradRows = 64;

// x: the output cotangent (n_in, C); w: (K, C, C), W[k] transposed
// (rows: C_out of the convolution); nmap: (rows, K) input-major map.
template <int C>
[[kernel]] void tensorops_dgrad(
    device float* x [[buffer(0)]],
    device float* w [[buffer(1)]],
    device const int* nmap [[buffer(2)]],
    device float* y [[buffer(3)]],
    constant ConvParams& p [[buffer(4)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]]) {
  threadgroup float xs[kDgradRows * C];
  threadgroup int any;
  const int t = int(lid);
  const int row0 = int(gid.x) * kDgradRows;

  constexpr auto desc = mpp::tensor_ops::matmul2d_descriptor(
      kDgradRows, C, C, false, false, false,
      mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
  mpp::tensor_ops::matmul2d<desc, execution_simdgroups<4>> op;
  auto xt = tensor<threadgroup float, dextents<int32_t, 2>, tensor_inline>(
      xs, dextents<int32_t, 2>(C, kDgradRows));
  auto w0 = tensor<device float, dextents<int32_t, 2>, tensor_inline>(w, dextents<int32_t, 2>(C, C));
  auto acc = op.template get_destination_cooperative_tensor<decltype(xt), decltype(w0), float>();
  for (int i = 0; i < int(acc.get_capacity()); ++i) {
    acc[i] = 0.0f;
  }
  for (int k = 0; k < p.k; ++k) {
    threadgroup_barrier(mem_flags::mem_threadgroup); // the last run is done with xs
    if (t == 0) {
      any = 0;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int i = t; i < kDgradRows * C; i += 128) {
      const int row = row0 + i / C;
      const int src = row < p.rows ? nmap[long(row) * p.k + k] : -1;
      xs[i] = src >= 0 ? x[long(src) * C + i % C] : 0.0f;
      if (src >= 0) {
        any = 1;
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (any == 0) {
      continue; // no row of this tile has offset k (uniform in the group)
    }
    auto wk = tensor<device float, dextents<int32_t, 2>, tensor_inline>(
        w + long(k) * C * C, dextents<int32_t, 2>(C, C));
    op.run(xt, wk, acc);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  acc.store(xt);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int i = t; i < kDgradRows * C; i += 128) {
    const int row = row0 + i / C;
    if (row < p.rows) {
      y[long(row) * C + i % C] = xs[i];
    }
  }
}

constexpr constant int kWgradChunk = 32; // edges per staged chunk

// partials[(k * parts + p) * A * B + a * B + c] = sum over the chunks of
// partition p of offset k of x[g, a] * ct[r, c].
template <typename T, int A, int B>
[[kernel]] void tensorops_wgrad(
    device const T* x [[buffer(0)]],
    device const T* ct [[buffer(1)]],
    device const int* offsets [[buffer(2)]],
    device const int* g_idx [[buffer(3)]],
    device const int* r_idx [[buffer(4)]],
    device float* partials [[buffer(5)]],
    constant WeightGradPartsParams& p [[buffer(6)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]]) {
  threadgroup T xs[kWgradChunk * A];
  threadgroup T cs[kWgradChunk * B];
  const int part = int(gid.x);
  const int k = int(gid.y);
  const int t = int(lid);
  const int e_begin = offsets[k];
  const int e_end = offsets[k + 1];

  // (A x B) += (A x chunk) * (chunk x B); the left operand is x^T, held as
  // the row-major chunk x A block (transpose_left).
  constexpr auto desc = mpp::tensor_ops::matmul2d_descriptor(
      A, B, kWgradChunk, true, false, false,
      mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
  mpp::tensor_ops::matmul2d<desc, execution_simdgroups<4>> op;
  auto xt = tensor<threadgroup T, dextents<int32_t, 2>, tensor_inline>(
      xs, dextents<int32_t, 2>(A, kWgradChunk));
  auto ctt = tensor<threadgroup T, dextents<int32_t, 2>, tensor_inline>(
      cs, dextents<int32_t, 2>(B, kWgradChunk));
  auto acc = op.template get_destination_cooperative_tensor<decltype(xt), decltype(ctt), float>();
  for (int i = 0; i < int(acc.get_capacity()); ++i) {
    acc[i] = 0.0f;
  }
  for (int e0 = e_begin + part * kWgradChunk; e0 < e_end; e0 += p.parts * kWgradChunk) {
    const int n = min(kWgradChunk, e_end - e0);
    threadgroup_barrier(mem_flags::mem_threadgroup); // the last run is done
    for (int i = t; i < kWgradChunk * A; i += 128) {
      const int e = i / A;
      xs[i] = e < n ? x[long(g_idx[e0 + e]) * A + i % A] : T(0.0f);
    }
    for (int i = t; i < kWgradChunk * B; i += 128) {
      const int e = i / B;
      cs[i] = e < n ? ct[long(r_idx[e0 + e]) * B + i % B] : T(0.0f);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    op.run(xt, ctt, acc);
  }
  auto out = tensor<device float, dextents<int32_t, 2>, tensor_inline>(
      partials + (long(k) * p.parts + part) * A * B, dextents<int32_t, 2>(B, A));
  acc.store(out);
}

template [[host_name("tensorops_dgrad_float32_c16")]] [[kernel]] decltype(tensorops_dgrad<16>) tensorops_dgrad<16>;
template [[host_name("tensorops_wgrad_float32_16x16")]] [[kernel]] decltype(tensorops_wgrad<float, 16, 16>) tensorops_wgrad<float, 16, 16>;
template [[host_name("tensorops_wgrad_float32_16x32")]] [[kernel]] decltype(tensorops_wgrad<float, 16, 32>) tensorops_wgrad<float, 16, 32>;
template [[host_name("tensorops_wgrad_float32_16x64")]] [[kernel]] decltype(tensorops_wgrad<float, 16, 64>) tensorops_wgrad<float, 16, 64>;
template [[host_name("tensorops_wgrad_float32_32x16")]] [[kernel]] decltype(tensorops_wgrad<float, 32, 16>) tensorops_wgrad<float, 32, 16>;
template [[host_name("tensorops_wgrad_float32_32x32")]] [[kernel]] decltype(tensorops_wgrad<float, 32, 32>) tensorops_wgrad<float, 32, 32>;
template [[host_name("tensorops_wgrad_float32_32x64")]] [[kernel]] decltype(tensorops_wgrad<float, 32, 64>) tensorops_wgrad<float, 32, 64>;
template [[host_name("tensorops_wgrad_float32_64x16")]] [[kernel]] decltype(tensorops_wgrad<float, 64, 16>) tensorops_wgrad<float, 64, 16>;
template [[host_name("tensorops_wgrad_float32_64x32")]] [[kernel]] decltype(tensorops_wgrad<float, 64, 32>) tensorops_wgrad<float, 64, 32>;
template [[host_name("tensorops_wgrad_float32_64x64")]] [[kernel]] decltype(tensorops_wgrad<float, 64, 64>) tensorops_wgrad<float, 64, 64>;
template [[host_name("tensorops_wgrad_float16_16x16")]] [[kernel]] decltype(tensorops_wgrad<half, 16, 16>) tensorops_wgrad<half, 16, 16>;
template [[host_name("tensorops_wgrad_float16_16x32")]] [[kernel]] decltype(tensorops_wgrad<half, 16, 32>) tensorops_wgrad<half, 16, 32>;
template [[host_name("tensorops_wgrad_float16_16x64")]] [[kernel]] decltype(tensorops_wgrad<half, 16, 64>) tensorops_wgrad<half, 16, 64>;
template [[host_name("tensorops_wgrad_float16_32x16")]] [[kernel]] decltype(tensorops_wgrad<half, 32, 16>) tensorops_wgrad<half, 32, 16>;
template [[host_name("tensorops_wgrad_float16_32x32")]] [[kernel]] decltype(tensorops_wgrad<half, 32, 32>) tensorops_wgrad<half, 32, 32>;
template [[host_name("tensorops_wgrad_float16_32x64")]] [[kernel]] decltype(tensorops_wgrad<half, 32, 64>) tensorops_wgrad<half, 32, 64>;
template [[host_name("tensorops_wgrad_float16_64x16")]] [[kernel]] decltype(tensorops_wgrad<half, 64, 16>) tensorops_wgrad<half, 64, 16>;
template [[host_name("tensorops_wgrad_float16_64x32")]] [[kernel]] decltype(tensorops_wgrad<half, 64, 32>) tensorops_wgrad<half, 64, 32>;
template [[host_name("tensorops_wgrad_float16_64x64")]] [[kernel]] decltype(tensorops_wgrad<half, 64, 64>) tensorops_wgrad<half, 64, 64>;

#endif // __METAL_VERSION__ >= 400
