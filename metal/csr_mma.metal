// Matrix-unit implicit GEMM over the CSR edges of a relation, either view
// (the convolution, or its input gradient with W transposed per offset), any
// channel counts, any kernel volume, float32 / float16 / bfloat16 features,
// and grouped products (GroupedParams: W is (K, ag, b), output channel c
// reads the ag input channels of its group c / bg; ag = a, bg = b without
// groups).
//
// A threadgroup owns 32 rows, consecutive positions of the view's row order,
// and BN output channels of one group (grid x: (group, column block),
// column blocks fastest, so the threadgroups of a row block are neighbours
// and share its gathered rows in cache; grid y: the row blocks), four
// simdgroups in a 2 x 2 layout, each a 16 x BN/2 block of 8x8 float
// accumulators. It walks its rows' edge lists together in rounds of the
// smallest pending offset (csr_rounds.h); each round's gathered rows (32 x
// 16 input channels of the group, zero for rows without an edge of the
// round) and W[k]'s slice (16 x BN) are staged as float in threadgroup
// memory, masked past the group's input and output channels, and
// multiplied on simdgroup matrices into the accumulators, which stay in
// registers until the tile is written (masked) once, each row at its place.
//
// Every output element is the sum of its edges' products in offset order,
// 16 input channels at a time, each slice in a fixed order: the same bits on
// every run. Programs: src/metal/csr_mma.cpp.
#include <metal_stdlib>

#include "csr_rounds.h"
#include "mma_tile.h"
#include "params.h"

using namespace metal;

constexpr constant int kRows = kCsrRoundRows; // rows per threadgroup
constexpr constant int kSlice = 16;            // input channels staged per step
constexpr constant int kThreads = 128;         // four simdgroups
// Row strides of the staged tiles (x: kLdx, W: BN + kMmaPad).
constexpr constant int kLdx = kSlice + kMmaPad;

template <typename T, int BN>
[[kernel, max_total_threads_per_threadgroup(128)]] void csr_mma(
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
  constexpr int kLdw = BN + kMmaPad;
  // Staged x (32 x 16) and W (16 x BN); at the end, one 8x8 block per
  // simdgroup on its way to y.
  threadgroup float smem[kRows * kLdx + kSlice * (BN + kMmaPad)];
  threadgroup int round_rows[kCsrRoundInts]; // the rounds' rows and offsets (csr_rounds.h)
  threadgroup float* xs = smem;
  threadgroup float* ws = smem + kRows * kLdx;

  const int row0 = int(gid.y) * kRows;
  const int col_blocks = max((p.bg + BN - 1) / BN, 1);
  const int n0 = int(gid.x) % col_blocks * BN; // within the group's output channels
  const int group = int(gid.x) / col_blocks;
  device const T* xg = x + group * p.ag; // the group's first channel of x
  const int yb = group * p.bg;            // its first output channel (of W's and y's b)
  const bool pointwise = p.pointwise_rows >= 0;
  const int sm = int(sg) / 2; // this simdgroup's rows: sm * 16 + [0, 16)
  const int sn = int(sg) % 2; // its channels: yb + n0 + sn * BN / 2 + [0, BN / 2)

  // Simdgroup 0, lane l: the cursor into the edges of the row at position
  // row0 + l of the order.
  CsrRoundCursor rows;
  rows.begin(sg == 0, row0 + int(lane), p.rows, order, offsets, gather, kidx, pointwise);

  MmaBlock<2, BN / 16> block; // rows sm * 16 + [0, 16), channels sn * BN / 2 + [0, BN / 2)
  block.clear();

  for (int round = 0;; ++round) {
    threadgroup int* rr = csr_round_half(round_rows, round);
    rows.take(rr, sg == 0, lane);
    const int k = rr[kRows];
    if (k == kCsrNone) {
      break; // every row's edges taken
    }
    device const T* wk = w + long(k) * p.ag * p.b + yb;
    for (int a0 = 0; a0 < p.ag; a0 += kSlice) {
      if (a0 > 0) {
        threadgroup_barrier(mem_flags::mem_threadgroup); // the last slice's products done
      }
      // 32 rows x 16 channels of the group (half a simdgroup per row), and
      // W[k] rows a0 + [0, 16), the group's channels n0 + [0, BN).
      mma_stage_rows(xs, kLdx, rr, kRows, kSlice, xg, p.a, p.ag, a0, int(t), kThreads);
      mma_stage_weight(ws, kLdw, kSlice, BN, wk, p.b, p.ag, p.bg, a0, n0, int(t), kThreads);
      threadgroup_barrier(mem_flags::mem_threadgroup);
      block.accumulate(xs + sm * 16 * kLdx, kLdx, ws + sn * (BN / 2), kLdw, min(kSlice, p.ag - a0));
    }
  }

  // Each simdgroup writes its blocks through its own 64 floats of the
  // staging area, masked to the rows and channels that exist. No barrier:
  // every thread passed the last round's after its last product.
  block.store(
      smem + int(sg) * 64, lane, y + yb, p.b, row0 + sm * 16, p.rows, n0 + sn * (BN / 2), p.bg,
      MmaRowsInOrder{order, pointwise});
}

#define LATTICE_INSTANTIATE(name, T, BN) \
  template [[host_name(name)]] [[kernel]] decltype(csr_mma<T, BN>) csr_mma<T, BN>;

LATTICE_INSTANTIATE("csr_mma_float32_n16", float, 16)
LATTICE_INSTANTIATE("csr_mma_float32_n32", float, 32)
LATTICE_INSTANTIATE("csr_mma_float32_n64", float, 64)
LATTICE_INSTANTIATE("csr_mma_float32_n128", float, 128)
LATTICE_INSTANTIATE("csr_mma_float16_n16", half, 16)
LATTICE_INSTANTIATE("csr_mma_float16_n32", half, 32)
LATTICE_INSTANTIATE("csr_mma_float16_n64", half, 64)
LATTICE_INSTANTIATE("csr_mma_float16_n128", half, 128)
LATTICE_INSTANTIATE("csr_mma_bfloat16_n16", bfloat, 16)
LATTICE_INSTANTIATE("csr_mma_bfloat16_n32", bfloat, 32)
LATTICE_INSTANTIATE("csr_mma_bfloat16_n64", bfloat, 64)
LATTICE_INSTANTIATE("csr_mma_bfloat16_n128", bfloat, 128)
