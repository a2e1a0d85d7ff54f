// The implicit GEMM of metal/csr_mma.metal on Metal 4 TensorOps: the same
// tiles, the same round walk and the same staging, each staged slice's
// products one MetalPerformancePrimitives matmul2d instead of 8x8
// simdgroup multiply-accumulates. Either view (the convolution, or its
// input gradient with W transposed per offset), any channel counts, any
// kernel volume, float32 / float16 / bfloat16 features. The kernels take
// GroupedParams as csr_mma's do (a group's channels a window of x, W and
// y); the route runs them with one group.
//
// A threadgroup owns 32 rows, consecutive positions of the view's row order,
// and BN output channels (grid x: (group, column block), column blocks
// fastest; grid y: the row blocks), four simdgroups sharing one matmul2d.
// It walks its rows' edge lists together in rounds of the smallest pending
// offset k (csr_rounds.h); each round's gathered rows (32 x 16 input
// channels, zero for rows without an edge of the round) and W[k]'s slice
// (16 x BN) are staged as float in threadgroup memory through mma_tile.h,
// masked past the input and output channels, and (32 x BN) += (32 x 16) *
// (16 x BN) runs over the four simdgroups into a float cooperative tensor.
// At the end the tile goes through threadgroup memory once and out to y,
// masked to the rows and channels that exist, each row at its place in the
// order.
//
// Every output element is the sum of its edges' products in round order,
// 16 input channels at a time, each slice in the operation's fixed order:
// the same bits on every run. Programs: src/metal/tensorops_csr_mma.cpp (csr_mma.cpp's).
// Compiled only as Metal 4.0, into mlx_lattice_tensorops.metallib (see
// tensorops_sorted.metal).
#include <metal_stdlib>

#include "csr_rounds.h"
#include "mma_tile.h"
#include "params.h"

#if __METAL_VERSION__ >= 400
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>

using namespace metal;

constexpr constant int kTcRows = kCsrRoundRows; // rows per threadgroup
constexpr constant int kTcSlice = 16;           // input channels staged per step
constexpr constant int kTcThreads = 128;        // four simdgroups

template <typename T, int BN>
[[kernel, max_total_threads_per_threadgroup(128)]] void tensorops_csr_mma(
    device const T* x [[buffer(0)]],
    device const T* w [[buffer(1)]],
    device const int* offsets [[buffer(2)]],
    device const int* gather [[buffer(3)]],
    device const int* kidx [[buffer(4)]],
    device const int* order [[buffer(5)]], // the view's rows in tile order
    device T* y [[buffer(6)]],
    constant GroupedParams& p [[buffer(7)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint t [[thread_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float xs[kTcRows * kTcSlice]; // staged x rows, row-major 32 x 16
  threadgroup float ws[kTcSlice * BN];      // staged W[k] slice, row-major 16 x BN
  threadgroup float os[kTcRows * BN];       // the finished tile, row-major
  threadgroup int round_rows[kCsrRoundInts]; // the rounds' rows and offsets (csr_rounds.h)

  const int row0 = int(gid.y) * kTcRows;
  const int col_blocks = max((p.bg + BN - 1) / BN, 1);
  const int n0 = int(gid.x) % col_blocks * BN; // within the group's output channels
  const int group = int(gid.x) / col_blocks;
  device const T* xg = x + group * p.ag; // the group's first channel of x
  const int yb = group * p.bg;            // its first output channel (of W's and y's b)
  const bool pointwise = p.pointwise_rows >= 0;

  // Simdgroup 0, lane l: the cursor into the edges of the row at position
  // row0 + l of the order.
  CsrRoundCursor rows;
  rows.begin(sg == 0, row0 + int(lane), p.rows, order, offsets, gather, kidx, pointwise);

  // tile (32 x BN) += x rows (32 x 16) * W[k] slice (16 x BN).
  constexpr auto desc = mpp::tensor_ops::matmul2d_descriptor(
      kTcRows, BN, kTcSlice, false, false, false,
      mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
  mpp::tensor_ops::matmul2d<desc, execution_simdgroups<4>> op;
  auto xt = tensor<threadgroup float, dextents<int32_t, 2>, tensor_inline>(
      xs, dextents<int32_t, 2>(kTcSlice, kTcRows));
  auto wt = tensor<threadgroup float, dextents<int32_t, 2>, tensor_inline>(
      ws, dextents<int32_t, 2>(BN, kTcSlice));
  auto acc = op.template get_destination_cooperative_tensor<decltype(xt), decltype(wt), float>();
  for (int i = 0; i < int(acc.get_capacity()); ++i) {
    acc[i] = 0.0f;
  }

  for (int round = 0;; ++round) {
    threadgroup int* rr = csr_round_half(round_rows, round);
    rows.take(rr, sg == 0, lane);
    const int k = rr[kTcRows];
    if (k == kCsrNone) {
      break; // every row's edges taken
    }
    device const T* wk = w + long(k) * p.ag * p.b + yb;
    for (int a0 = 0; a0 < p.ag; a0 += kTcSlice) {
      if (a0 > 0) {
        threadgroup_barrier(mem_flags::mem_threadgroup); // the last slice's product done
      }
      mma_stage_rows(xs, kTcSlice, rr, kTcRows, kTcSlice, xg, p.a, p.ag, a0, int(t), kTcThreads);
      mma_stage_weight(ws, BN, kTcSlice, BN, wk, p.b, p.ag, p.bg, a0, n0, int(t), kTcThreads);
      threadgroup_barrier(mem_flags::mem_threadgroup);
      op.run(xt, wt, acc);
    }
  }

  // The tile out through threadgroup memory (its own, so no barrier before
  // the store), masked to the rows and channels that exist.
  auto ot = tensor<threadgroup float, dextents<int32_t, 2>, tensor_inline>(
      os, dextents<int32_t, 2>(BN, kTcRows));
  acc.store(ot);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const MmaRowsInOrder row_of{order, pointwise};
  for (int i = int(t); i < kTcRows * BN; i += kTcThreads) {
    const int r = row0 + i / BN;
    const int n = n0 + i % BN;
    if (r < p.rows && n < p.bg) {
      y[long(row_of(r)) * p.b + yb + n] = T(os[i]);
    }
  }
}

#define LATTICE_INSTANTIATE(name, T, BN) \
  template [[host_name(name)]] [[kernel]] decltype(tensorops_csr_mma<T, BN>) tensorops_csr_mma<T, BN>;

LATTICE_INSTANTIATE("tensorops_csr_mma_float32_n16", float, 16)
LATTICE_INSTANTIATE("tensorops_csr_mma_float32_n32", float, 32)
LATTICE_INSTANTIATE("tensorops_csr_mma_float32_n64", float, 64)
LATTICE_INSTANTIATE("tensorops_csr_mma_float32_n128", float, 128)
LATTICE_INSTANTIATE("tensorops_csr_mma_float16_n16", half, 16)
LATTICE_INSTANTIATE("tensorops_csr_mma_float16_n32", half, 32)
LATTICE_INSTANTIATE("tensorops_csr_mma_float16_n64", half, 64)
LATTICE_INSTANTIATE("tensorops_csr_mma_float16_n128", half, 128)
LATTICE_INSTANTIATE("tensorops_csr_mma_bfloat16_n16", bfloat, 16)
LATTICE_INSTANTIATE("tensorops_csr_mma_bfloat16_n32", bfloat, 32)
LATTICE_INSTANTIATE("tensorops_csr_mma_bfloat16_n64", bfloat, 64)
LATTICE_INSTANTIATE("tensorops_csr_mma_bfloat16_n128", bfloat, 128)

#endif // __METAL_VERSION__ >= 400
