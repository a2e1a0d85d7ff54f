// What the simdgroup-matrix kernels share (csr_mma.metal, wgrad_mma.metal,
// forward_dense.metal; grouped products and ungrouped alike): staging rows
// and weight slices as float in threadgroup memory with masked loads, and
// one simdgroup's block of 8x8 float accumulators, its products and its
// masked write-out. A group's channels are a window of wider rows: callers
// pass pointers offset to the group's first channel, the rows' stride, and
// the group's channel counts as the limits.
//
// Every accumulator element is summed in one order (the depth of each
// staged slice in order, the caller's slices in order): the same bits
// whatever order threads run in.
#pragma once

#include <metal_stdlib>

using namespace metal;

// Row strides of staged tiles are padded by kMmaPad floats (16 bytes) so
// that the rows an 8x8 load reads fall on different banks.
constexpr constant int kMmaPad = 4;

// xs[r][c] (row stride ldx) = x[rows[r]][a0 + c] for r < n_rows, c < slice,
// as float; zero where rows[r] < 0 or a0 + c >= a. x's rows are ld elements
// apart and a <= ld channels of each are read: x points at a group's first
// channel (ld = a without groups). Threads t, t + nt, ... of the group:
// consecutive threads read consecutive channels of a row.
template <typename T>
inline void mma_stage_rows(
    threadgroup float* xs,
    int ldx,
    threadgroup const int* rows,
    int n_rows,
    int slice,
    device const T* x,
    int ld,
    int a,
    int a0,
    int t,
    int nt) {
  for (int i = t; i < n_rows * slice; i += nt) {
    const int r = i / slice;
    const int c = a0 + i % slice;
    const int g = rows[r];
    xs[r * ldx + i % slice] = g >= 0 && c < a ? float(x[long(g) * ld + c]) : 0.0f;
  }
}

// ws[i][j] (row stride ldw) = wk[a0 + i][n0 + j] for i < slice, j < bn, as
// float; zero past a rows or b columns. wk's rows are ld elements apart
// (ld >= b): wk points at a group's first output channel of a row-major
// (a, ld) slice (ld = b without groups).
template <typename T>
inline void mma_stage_weight(
    threadgroup float* ws,
    int ldw,
    int slice,
    int bn,
    device const T* wk,
    int ld,
    int a,
    int b,
    int a0,
    int n0,
    int t,
    int nt) {
  for (int i = t; i < slice * bn; i += nt) {
    const int r = a0 + i / bn;
    const int c = n0 + i % bn;
    ws[(i / bn) * ldw + i % bn] = r < a && c < b ? float(wk[long(r) * ld + c]) : 0.0f;
  }
}

// Where a tile's rows are written: row r of the tile's positions is row r
// of the output (MmaRowsInPlace), or row order[r] (MmaRowsInOrder, the
// view's row order; in_place: r itself, for products without one).
struct MmaRowsInPlace {
  int operator()(int r) const {
    return r;
  }
};

struct MmaRowsInOrder {
  device const int* order;
  bool in_place;
  int operator()(int r) const {
    return in_place ? r : order[r];
  }
};

// One simdgroup's FM x FN 8x8 float accumulators: an (8 FM) x (8 FN) block
// of the threadgroup's output tile.
template <int FM, int FN>
struct MmaBlock {
  simdgroup_float8x8 acc[FM][FN];

  void clear() {
    for (int i = 0; i < FM; ++i) {
      for (int j = 0; j < FN; ++j) {
        acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      }
    }
  }

  // acc += A B: A the staged rows [0, 8 FM) x [0, depth) at xs (stride
  // ldx), B the staged [0, depth) x [0, 8 FN) at ws (stride ldw). depth is
  // rounded up to a multiple of 8: the staged zeros past the data.
  void accumulate(
      threadgroup const float* xs,
      int ldx,
      threadgroup const float* ws,
      int ldw,
      int depth) {
    for (int kk = 0; kk < depth; kk += 8) {
      simdgroup_float8x8 xa[FM];
      for (int i = 0; i < FM; ++i) {
        simdgroup_load(xa[i], xs + i * 8 * ldx + kk, ldx);
      }
      for (int j = 0; j < FN; ++j) {
        simdgroup_float8x8 wb;
        simdgroup_load(wb, ws + kk * ldw + j * 8, ldw);
        for (int i = 0; i < FM; ++i) {
          simdgroup_multiply_accumulate(acc[i][j], xa[i], wb, acc[i][j]);
        }
      }
    }
  }

  // out[row_of(r)][c] (row stride ld) = the block's element for positions
  // r in r0 + [0, 8 FM) and columns c0 + [0, 8 FN) that fall below rows x
  // cols, through this simdgroup's own 64 floats at stage. out may point at
  // a group's first column (cols its channels, ld the rows' full width).
  template <typename U, typename RowOf = MmaRowsInPlace>
  void store(
      threadgroup float* stage,
      uint lane,
      device U* out,
      long ld,
      int r0,
      int rows,
      int c0,
      int cols,
      RowOf row_of = RowOf()) {
    for (int i = 0; i < FM; ++i) {
      for (int j = 0; j < FN; ++j) {
        simdgroup_store(acc[i][j], stage, 8);
        simdgroup_barrier(mem_flags::mem_threadgroup);
        for (int q = int(lane); q < 64; q += 32) {
          const int r = r0 + i * 8 + q / 8;
          const int c = c0 + j * 8 + q % 8;
          if (r < rows && c < cols) {
            out[long(row_of(r)) * ld + c] = U(stage[q]);
          }
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);
      }
    }
  }
};
