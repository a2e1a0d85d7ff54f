// Matrix-unit weight gradient over the kernel-major edges, any channel
// counts, any kernel volume, float32 / float16 / bfloat16 features:
// dW[k] = sum over the edges (g, r) of offset k of x[g]^T ct[r]; grouped
// products too (WeightGradMmaParams::groups: dW is (K, A / groups, B), and
// group j's block is x's channels of group j against ct's of group j).
//
// Threadgroup (block, part q, offset k) owns a 32 x BN block of one group's
// dW[k] (blocks enumerate (group, input block, output block), output blocks
// fastest; input channels a0 + [0, 32) of the group, output channels
// n0 + [0, BN) of the group; four
// simdgroups in a 2 x 2 layout, each 16 x BN/2 of 8x8 float accumulators)
// and sums 16-edge chunks q, q + P, q + 2P, ... of offset k's edges: each
// chunk's x rows (transposed, 32 channels x 16 edges) and ct rows (16 x BN)
// are staged as float in threadgroup memory, masked past the edges and
// channels, and multiplied on simdgroup matrices. With one part the block
// is written to dW; with P > 1 to a float partial, and wgrad_reduce
// (backward.metal) adds the P partials of each element in order.
//
// Every element is summed in one order (chunks in order within a part,
// parts in order): the same bits on every run. Programs:
// src/metal/wgrad_mma.cpp.
#include <metal_stdlib>

#include "mma_tile.h"
#include "params.h"

using namespace metal;

constexpr constant int kBlockA = 32; // input channels (rows of dW) per threadgroup
constexpr constant int kChunk = 16;  // edges staged per step
constexpr constant int kThreads = 128;
// Row strides of the staged tiles (x^T: kLdx, ct: BN + kMmaPad).
constexpr constant int kLdx = kChunk + kMmaPad;

template <typename T, int BN>
[[kernel, max_total_threads_per_threadgroup(128)]] void wgrad_mma(
    device const T* x [[buffer(0)]],
    device const T* ct [[buffer(1)]],
    device const int* offsets [[buffer(2)]],
    device const int* g_idx [[buffer(3)]],
    device const int* r_idx [[buffer(4)]],
    device float* partials [[buffer(5)]],
    device T* dw [[buffer(6)]],
    constant WeightGradMmaParams& p [[buffer(7)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint t [[thread_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]) {
  constexpr int kLdc = BN + kMmaPad;
  // Staged x^T (32 x 16) and ct (16 x BN); at the end, one 8x8 block per
  // simdgroup on its way out.
  threadgroup float smem[kBlockA * kLdx + kChunk * (BN + kMmaPad)];
  threadgroup float* xs = smem;
  threadgroup float* cs = smem + kBlockA * kLdx;

  const int bg = p.b / p.groups;         // output channels per group
  const int x_cols = p.a * p.groups;     // x's channels (and its row stride)
  const int n_blocks = max((bg + BN - 1) / BN, 1);
  const int a_blocks = max((p.a + kBlockA - 1) / kBlockA, 1);
  const int a0 = int(gid.x) / n_blocks % a_blocks * kBlockA;
  const int n0 = int(gid.x) % n_blocks * BN;
  const int group = int(gid.x) / (n_blocks * a_blocks);
  device const T* xg = x + group * p.a; // the group's first channel of x
  const int yb = group * bg;             // its first output channel (of ct's and dW's b)
  device const T* ctg = ct + yb;
  const int q = int(gid.y);
  const int k = int(gid.z);
  const int sm = int(sg) / 2; // this simdgroup's dW rows: a0 + sm * 16 + [0, 16)
  const int sn = int(sg) % 2; // its columns: yb + n0 + sn * BN / 2 + [0, BN / 2)
  const bool pointwise = p.pointwise_rows >= 0;
  const int e0 = pointwise ? 0 : offsets[k];
  const int e1 = pointwise ? p.pointwise_rows : offsets[k + 1];

  MmaBlock<2, BN / 16> block; // dW rows sm * 16 + [0, 16), columns sn * BN / 2 + [0, BN / 2)
  block.clear();

  for (int c0 = e0 + q * kChunk; c0 < e1; c0 += p.parts * kChunk) {
    if (c0 > e0 + q * kChunk) {
      threadgroup_barrier(mem_flags::mem_threadgroup); // the last chunk's products done
    }
    // x rows of the chunk, transposed: consecutive threads read consecutive
    // channels of one edge's row.
    for (int i = int(t); i < kChunk * kBlockA; i += kThreads) {
      const int e = c0 + i / kBlockA;
      const int a = a0 + i % kBlockA;
      float v = 0.0f;
      if (e < e1 && a < p.a) {
        const long g = pointwise ? e : g_idx[e];
        v = float(xg[g * x_cols + a]);
      }
      xs[(i % kBlockA) * kLdx + i / kBlockA] = v;
    }
    for (int i = int(t); i < kChunk * BN; i += kThreads) {
      const int e = c0 + i / BN;
      const int n = n0 + i % BN;
      float v = 0.0f;
      if (e < e1 && n < bg) {
        const long r = pointwise ? e : r_idx[e];
        v = float(ctg[r * p.b + n]);
      }
      cs[(i / BN) * kLdc + i % BN] = v;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    block.accumulate(xs + sm * 16 * kLdx, kLdx, cs + sn * (BN / 2), kLdc, min(kChunk, e1 - c0));
  }

  // Each simdgroup writes its blocks through its own 64 floats of the
  // staging area, masked to the group's channels.
  threadgroup_barrier(mem_flags::mem_threadgroup); // staged tiles no longer read
  threadgroup float* stage = smem + int(sg) * 64;
  const int r0 = a0 + sm * 16;
  const int c0 = n0 + sn * (BN / 2);
  if (p.parts > 1) {
    block.store(stage, lane, partials + (long(k) * p.parts + q) * p.a * p.b + yb, p.b, r0, p.a, c0, bg);
  } else {
    block.store(stage, lane, dw + long(k) * p.a * p.b + yb, p.b, r0, p.a, c0, bg);
  }
}

#define LATTICE_INSTANTIATE(name, T, BN) \
  template [[host_name(name)]] [[kernel]] decltype(wgrad_mma<T, BN>) wgrad_mma<T, BN>;

LATTICE_INSTANTIATE("wgrad_mma_float32_n32", float, 32)
LATTICE_INSTANTIATE("wgrad_mma_float32_n64", float, 64)
LATTICE_INSTANTIATE("wgrad_mma_float16_n32", half, 32)
LATTICE_INSTANTIATE("wgrad_mma_float16_n64", half, 64)
LATTICE_INSTANTIATE("wgrad_mma_bfloat16_n32", bfloat, 32)
LATTICE_INSTANTIATE("wgrad_mma_bfloat16_n64", bfloat, 64)
