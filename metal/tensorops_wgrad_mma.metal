// The weight gradient of metal/wgrad_mma.metal on Metal 4 TensorOps: the
// same blocks of dW[k], the same 16-edge chunks and the same partitions,
// each chunk's products one MetalPerformancePrimitives matmul2d instead of
// 8x8 simdgroup multiply-accumulates. Any channel counts, any kernel
// volume, float32 / float16 / bfloat16 features; grouped products too
// (WeightGradMmaParams::groups, as in wgrad_mma.metal).
//
// Threadgroup (block, part q, offset k) owns a 32 x BN block of one group's
// dW[k] (blocks enumerate (group, input block, output block), output blocks
// fastest) and sums 16-edge chunks q, q + P, q + 2P, ... of offset k's
// edges: each chunk's x rows (16 edges x 32 channels, the transposed left
// operand) and ct rows (16 x BN) are staged in threadgroup memory (float32
// and float16 as they are, bfloat16 converted to float), zero past the
// edges and channels, and
// (32 x BN) += (32 x 16) * (16 x BN) runs over the four simdgroups into a
// float cooperative tensor. At the end the block goes through threadgroup
// memory, masked to the group's channels: to dW with one part, else to a
// float partial that wgrad_reduce (backward.metal, in mlx_lattice.metallib)
// adds in part order, exactly as after wgrad_mma.
//
// Every element is summed in one order (chunks in order within a part,
// parts in order): the same bits on every run. Programs:
// src/metal/tensorops_wgrad_mma.cpp. Compiled only as Metal 4.0, into
// mlx_lattice_tensorops.metallib (see tensorops_sorted.metal).
#include <metal_stdlib>

#include "params.h"

#if __METAL_VERSION__ >= 400
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>

using namespace metal;

constexpr constant int kWmmaBlockA = 32; // input channels (rows of dW) per threadgroup
constexpr constant int kWmmaChunk = 16;  // edges staged per step
constexpr constant int kWmmaThreads = 128;

// The staged operands' type: the feature dtype for float and half (matmul2d
// multiplies them into float as they are), float for bfloat (converted
// while staging).
template <typename T>
struct WmmaStaged {
  using type = T;
};
template <>
struct WmmaStaged<bfloat> {
  using type = float;
};

template <typename T, int BN>
[[kernel, max_total_threads_per_threadgroup(128)]] void tensorops_wgrad_mma(
    device const T* x [[buffer(0)]],
    device const T* ct [[buffer(1)]],
    device const int* offsets [[buffer(2)]],
    device const int* g_idx [[buffer(3)]],
    device const int* r_idx [[buffer(4)]],
    device float* partials [[buffer(5)]],
    device T* dw [[buffer(6)]],
    constant WeightGradMmaParams& p [[buffer(7)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint t [[thread_index_in_threadgroup]]) {
  threadgroup float os[kWmmaBlockA * BN]; // the finished block, row-major
  using S = typename WmmaStaged<T>::type;
  threadgroup S xs[kWmmaChunk * kWmmaBlockA]; // x rows of the chunk: A^T, row-major
  threadgroup S cs[kWmmaChunk * BN];          // ct rows of the chunk

  const int bg = p.b / p.groups;         // output channels per group
  const int x_cols = p.a * p.groups;     // x's channels (and its row stride)
  const int n_blocks = max((bg + BN - 1) / BN, 1);
  const int a_blocks = max((p.a + kWmmaBlockA - 1) / kWmmaBlockA, 1);
  const int a0 = int(gid.x) / n_blocks % a_blocks * kWmmaBlockA;
  const int n0 = int(gid.x) % n_blocks * BN;
  const int group = int(gid.x) / (n_blocks * a_blocks);
  device const T* xg = x + group * p.a; // the group's first channel of x
  const int yb = group * bg;             // its first output channel (of ct's and dW's b)
  device const T* ctg = ct + yb;
  const int q = int(gid.y);
  const int k = int(gid.z);
  const bool pointwise = p.pointwise_rows >= 0;
  const int e0 = pointwise ? 0 : offsets[k];
  const int e1 = pointwise ? p.pointwise_rows : offsets[k + 1];

  // dW block (32 x BN) += x^T (32 x 16) * ct (16 x BN); the left operand is
  // held as x's rows, 16 x 32 (transpose_left).
  constexpr auto desc = mpp::tensor_ops::matmul2d_descriptor(
      kWmmaBlockA, BN, kWmmaChunk, true, false, false,
      mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
  mpp::tensor_ops::matmul2d<desc, execution_simdgroups<4>> op;
  auto xt = tensor<threadgroup S, dextents<int32_t, 2>, tensor_inline>(
      xs, dextents<int32_t, 2>(kWmmaBlockA, kWmmaChunk));
  auto ctt = tensor<threadgroup S, dextents<int32_t, 2>, tensor_inline>(
      cs, dextents<int32_t, 2>(BN, kWmmaChunk));
  auto acc = op.template get_destination_cooperative_tensor<decltype(xt), decltype(ctt), float>();
  for (int i = 0; i < int(acc.get_capacity()); ++i) {
    acc[i] = 0.0f;
  }

  for (int c0 = e0 + q * kWmmaChunk; c0 < e1; c0 += p.parts * kWmmaChunk) {
    threadgroup_barrier(mem_flags::mem_threadgroup); // the last chunk's product done
    // Consecutive threads read consecutive channels of one edge's row.
    for (int i = int(t); i < kWmmaChunk * kWmmaBlockA; i += kWmmaThreads) {
      const int e = c0 + i / kWmmaBlockA;
      const int a = a0 + i % kWmmaBlockA;
      S v = S(0.0f);
      if (e < e1 && a < p.a) {
        const long g = pointwise ? e : g_idx[e];
        v = S(xg[g * x_cols + a]);
      }
      xs[i] = v;
    }
    for (int i = int(t); i < kWmmaChunk * BN; i += kWmmaThreads) {
      const int e = c0 + i / BN;
      const int n = n0 + i % BN;
      S v = S(0.0f);
      if (e < e1 && n < bg) {
        const long r = pointwise ? e : r_idx[e];
        v = S(ctg[r * p.b + n]);
      }
      cs[i] = v;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    op.run(xt, ctt, acc);
  }

  // The block out through threadgroup memory, masked to the group's
  // channels: dW in its dtype with one part, else the float partial.
  auto ot = tensor<threadgroup float, dextents<int32_t, 2>, tensor_inline>(
      os, dextents<int32_t, 2>(BN, kWmmaBlockA));
  acc.store(ot);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const bool partial = p.parts > 1;
  const long base = (partial ? long(k) * p.parts + q : long(k)) * p.a * p.b + yb;
  for (int i = int(t); i < kWmmaBlockA * BN; i += kWmmaThreads) {
    const int a = a0 + i / BN;
    const int n = n0 + i % BN;
    if (a < p.a && n < bg) {
      if (partial) {
        partials[base + long(a) * p.b + n] = os[i];
      } else {
        dw[base + long(a) * p.b + n] = T(os[i]);
      }
    }
  }
}

#define LATTICE_INSTANTIATE(name, T, BN) \
  template [[host_name(name)]] [[kernel]] decltype(tensorops_wgrad_mma<T, BN>) tensorops_wgrad_mma<T, BN>;

LATTICE_INSTANTIATE("tensorops_wgrad_mma_float32_n32", float, 32)
LATTICE_INSTANTIATE("tensorops_wgrad_mma_float32_n64", float, 64)
LATTICE_INSTANTIATE("tensorops_wgrad_mma_float16_n32", half, 32)
LATTICE_INSTANTIATE("tensorops_wgrad_mma_float16_n64", half, 64)
LATTICE_INSTANTIATE("tensorops_wgrad_mma_bfloat16_n32", bfloat, 32)
LATTICE_INSTANTIATE("tensorops_wgrad_mma_bfloat16_n64", bfloat, 64)

#endif // __METAL_VERSION__ >= 400
