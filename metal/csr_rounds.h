// The round walk of a 32-row tile over its rows' CSR edges, shared by the
// kernels that tile the view's row order (csr_mma.metal on simdgroup
// matrices, tensorops_csr_mma.metal on TensorOps).
//
// A tile owns 32 rows, consecutive positions of the view's row order (order:
// rows sorted by the set of offsets their edges have, so that a tile's rows
// mostly share their offsets). It walks its rows' edge lists together in
// rounds: each round takes the smallest kernel offset k still pending among
// the 32 rows (the CSR lists are sorted by offset within a row, so a round
// is usually one offset, and offsets no row of the tile has are never
// visited); rows whose next edge has offset k gather that input row, the
// others none (-1). Lists in another order are walked all the same: every
// edge is taken once, rounds then visit an offset more than once.
//
// Simdgroup 0 keeps the cursors, lane l the one of row position row0 + l.
// A round's rows and offset are double-buffered by round parity: simdgroup 0
// fills round r + 1's with only round r's barrier behind it (the caller's
// slice barriers too, but there are none without input channels), while the
// others may still read round r's.
#pragma once

#include <metal_stdlib>

using namespace metal;

constexpr constant int kCsrRoundRows = 32;         // rows per tile (one per lane of simdgroup 0)
constexpr constant int kCsrNone = 0x7fffffff;      // no pending edge; the offset of the last round
constexpr constant int kCsrRoundInts = 2 * (kCsrRoundRows + 1); // the rounds' threadgroup ints

// One lane's cursor into the edges of its row: r, the row at position i of
// the order (i itself for a pointwise product, whose row r has the one edge
// r, offset 0, input row r), the edge e under it and the end of its list,
// with the offset and input row of edge e loaded one round ahead.
struct CsrRoundCursor {
  device const int* gather;
  device const int* kidx;
  bool pointwise;
  int r;
  int e;
  int e1;
  int next_k;
  int next_g;

  // Position i of the order (rows positions exist); none past them or
  // outside simdgroup 0 (leader false).
  void begin(
      bool leader,
      int i,
      int rows,
      device const int* order,
      device const int* offsets,
      device const int* gather_,
      device const int* kidx_,
      bool pointwise_) {
    gather = gather_;
    kidx = kidx_;
    pointwise = pointwise_;
    r = -1;
    e = 0;
    e1 = 0;
    next_k = kCsrNone;
    next_g = -1;
    if (leader && i < rows) {
      r = pointwise ? i : order[i];
      e = pointwise ? r : offsets[r];
      e1 = pointwise ? r + 1 : offsets[r + 1];
    }
    load();
  }

  void load() {
    next_k = e < e1 ? (pointwise ? 0 : kidx[e]) : kCsrNone;
    next_g = e < e1 ? (pointwise ? r : gather[e]) : -1;
  }

  // A round of the tile, called by every thread of the threadgroup (lane:
  // its index in its simdgroup) with the round's half of the rounds' ints
  // (csr_round_half): simdgroup 0 (leader) writes each row's input row (-1
  // for none) at [0, 32) and the round's offset (kCsrNone once every edge
  // is taken) at [32], and moves its cursors on; after the barrier every
  // thread reads them.
  void take(threadgroup int* rr, bool leader, uint lane) {
    if (leader) {
      const int k = simd_min(next_k);
      const bool taken = next_k == k && k != kCsrNone;
      rr[lane] = taken ? next_g : -1;
      if (lane == 0) {
        rr[kCsrRoundRows] = k;
      }
      if (taken) {
        ++e;
        load();
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
};

// Round `round`'s half of the rounds' kCsrRoundInts threadgroup ints.
inline threadgroup int* csr_round_half(threadgroup int* round_rows, int round) {
  return round_rows + (round & 1) * (kCsrRoundRows + 1);
}
