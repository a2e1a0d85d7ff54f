// Dense-channel routes and the pointwise (1x1x1) GEMM, on simdgroup
// matrices (8x8 float fragments, float accumulation). Programs:
// src/metal/forward_dense.cpp.
//
// dense_mma: the neighbour-map product with channel counts known at compile
// time (C_in, C_out in {16, 32, 64}): forward over the output-major map
// (rows, K), and the input gradient over the input-major map with W
// transposed per offset. A threadgroup owns R rows (32, or 64 for the
// grouped input gradient), consecutive positions of the view's row order
// (rows sorted by their offset sets: a tile's rows mostly share them), and
// all C_out channels, four simdgroups in a 2 x 2
// layout, each an R/2 x C_out/2 block of accumulators. Offsets are visited
// in order; an offset no row of the tile has is skipped. For the others the
// rows' gathered inputs (zeros where a row has no neighbour) and W[k] are
// staged as float in threadgroup memory, all C_in channels at once, or half
// of them at a time where the two would pass 28 KiB, and multiplied into the
// accumulators, which stay in registers until the tile is written once,
// each row at its place.
//
// pointwise_mma: y = x @ W[0], any channel counts: 64 rows x BN output
// channels per threadgroup (2 x 2 simdgroups, each 32 x BN/2), x and W[0]
// staged 32 input channels at a time, masked past C_in, C_out and the rows.
//
// Every output element is the sum of its products in offset order, each
// staged slice in a fixed order: the same bits on every run.
#include <metal_stdlib>

#include "mma_tile.h"
#include "params.h"

using namespace metal;

constexpr constant int kDenseThreads = 128; // four simdgroups

// Input channels staged per step: all of them while the staged rows and
// W[k] take at most 28 KiB, else half.
template <int CI, int CO, int R>
constexpr int dense_slice() {
  return (R * (CI + kMmaPad) + CI * (CO + kMmaPad)) * 4 <= 28 * 1024 ? CI : CI / 2;
}

// Floats staged: R rows and W[k], dense_slice() input channels each.
template <int CI, int CO, int R>
constexpr int dense_staged() {
  return R * (dense_slice<CI, CO, R>() + kMmaPad) + dense_slice<CI, CO, R>() * (CO + kMmaPad);
}

template <typename T, int CI, int CO, int R>
[[kernel, max_total_threads_per_threadgroup(128)]] void dense_mma(
    device const T* x [[buffer(0)]],
    device const T* w [[buffer(1)]],
    device const int* nmap [[buffer(2)]],
    device const int* order [[buffer(3)]], // the view's rows in tile order
    device T* y [[buffer(4)]],
    constant ConvParams& p [[buffer(5)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint t [[thread_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]) {
  constexpr int kS = dense_slice<CI, CO, R>();
  constexpr int kLdx = kS + kMmaPad;
  constexpr int kLdw = CO + kMmaPad;
  // Staged rows (R x kS) and W[k] (kS x C_out); at the end, one 8x8 block
  // per simdgroup on its way to y.
  threadgroup float smem[dense_staged<CI, CO, R>()];
  threadgroup int rows[R];    // the offset's input row per tile row, -1: none
  threadgroup int present[1]; // 1: a row of the tile has the offset
  threadgroup float* xs = smem;
  threadgroup float* ws = smem + R * kLdx;

  const int row0 = int(gid.x) * R;
  const int sm = int(sg) / 2; // this simdgroup's rows: sm * R / 2 + [0, R / 2)
  const int sn = int(sg) % 2; // its channels: sn * C_out / 2 + [0, C_out / 2)

  // The rows this lane reads the map of: positions row0 + j * 32 + lane.
  int src[R / 32];
  for (int j = 0; j < R / 32; ++j) {
    const int i = row0 + j * 32 + int(lane);
    src[j] = i < p.rows ? order[i] : -1;
  }

  MmaBlock<R / 16, CO / 16> block;
  block.clear();
  for (int k = 0; k < p.k; ++k) {
    threadgroup_barrier(mem_flags::mem_threadgroup); // the last offset's products done
    // Every simdgroup reads the tile's map entries (lane l: positions l,
    // l + 32, ...); simdgroup j keeps 32 j + [0, 32) for the staging, and
    // simdgroup 0 says whether any row has offset k.
    bool has = false;
    for (int j = 0; j < R / 32; ++j) {
      const int g = src[j] >= 0 ? nmap[long(src[j]) * p.k + k] : -1;
      has = has || g >= 0;
      if (int(sg) == j) {
        rows[j * 32 + int(lane)] = g;
      }
    }
    const bool any = simd_any(has);
    if (sg == 0 && lane == 0) {
      present[0] = any ? 1 : 0;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (present[0] == 0) {
      continue; // no row of this tile has offset k: the same for every thread
    }
    device const T* wk = w + long(k) * CI * CO;
    for (int a0 = 0; a0 < CI; a0 += kS) {
      if (a0 > 0) {
        threadgroup_barrier(mem_flags::mem_threadgroup); // the last slice's products done
      }
      mma_stage_rows(xs, kLdx, rows, R, kS, x, CI, CI, a0, int(t), kDenseThreads);
      mma_stage_weight(ws, kLdw, kS, CO, wk, CO, CI, CO, a0, 0, int(t), kDenseThreads);
      threadgroup_barrier(mem_flags::mem_threadgroup);
      block.accumulate(xs + sm * (R / 2) * kLdx, kLdx, ws + sn * (CO / 2), kLdw, kS);
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup); // staged tiles no longer read
  block.store(
      smem + int(sg) * 64, lane, y, CO, row0 + sm * (R / 2), p.rows, sn * (CO / 2), CO,
      MmaRowsInOrder{order, false});
}

constexpr constant int kPointRows = 64;  // rows per threadgroup
constexpr constant int kPointSlice = 32; // input channels staged per step

template <typename T, int BN>
[[kernel, max_total_threads_per_threadgroup(128)]] void pointwise_mma(
    device const T* x [[buffer(0)]],
    device const T* w [[buffer(1)]],
    device T* y [[buffer(2)]],
    constant ConvParams& p [[buffer(3)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint t [[thread_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]) {
  constexpr int kLdx = kPointSlice + kMmaPad;
  constexpr int kLdw = BN + kMmaPad;
  threadgroup float smem[kPointRows * (kPointSlice + kMmaPad) + kPointSlice * (BN + kMmaPad)];
  threadgroup int rows[kPointRows]; // row r reads row r; -1 past the rows
  threadgroup float* xs = smem;
  threadgroup float* ws = smem + kPointRows * kLdx;

  const int row0 = int(gid.y) * kPointRows;
  const int n0 = int(gid.x) * BN;
  const int sm = int(sg) / 2; // this simdgroup's rows: sm * 32 + [0, 32)
  const int sn = int(sg) % 2; // its channels: n0 + sn * BN / 2 + [0, BN / 2)
  if (int(t) < kPointRows) {
    rows[t] = row0 + int(t) < p.rows ? row0 + int(t) : -1;
  }

  MmaBlock<kPointRows / 16, BN / 16> block;
  block.clear();
  for (int a0 = 0; a0 < p.a; a0 += kPointSlice) {
    threadgroup_barrier(mem_flags::mem_threadgroup); // rows written; the last slice's products done
    mma_stage_rows(xs, kLdx, rows, kPointRows, kPointSlice, x, p.a, p.a, a0, int(t), kDenseThreads);
    mma_stage_weight(ws, kLdw, kPointSlice, BN, w, p.b, p.a, p.b, a0, n0, int(t), kDenseThreads);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    block.accumulate(xs + sm * 32 * kLdx, kLdx, ws + sn * (BN / 2), kLdw, min(kPointSlice, p.a - a0));
  }
  threadgroup_barrier(mem_flags::mem_threadgroup); // staged tiles no longer read
  block.store(smem + int(sg) * 64, lane, y, p.b, row0 + sm * 32, p.rows, n0 + sn * (BN / 2), p.b);
}

// One instantiation per supported channel pair and dtype: 32-row tiles for
// metal.dense_channel and metal.dgrad_dense_channel, 64-row tiles for
// metal.dgrad_dense_grouped.
#define LATTICE_DENSE(name, T, CI, CO, R) \
  template [[host_name(name)]] [[kernel]] decltype(dense_mma<T, CI, CO, R>) dense_mma<T, CI, CO, R>;

LATTICE_DENSE("dense_channel_float32_16x16", float, 16, 16, 32)
LATTICE_DENSE("dense_channel_float32_16x32", float, 16, 32, 32)
LATTICE_DENSE("dense_channel_float32_16x64", float, 16, 64, 32)
LATTICE_DENSE("dense_channel_float32_32x16", float, 32, 16, 32)
LATTICE_DENSE("dense_channel_float32_32x32", float, 32, 32, 32)
LATTICE_DENSE("dense_channel_float32_32x64", float, 32, 64, 32)
LATTICE_DENSE("dense_channel_float32_64x16", float, 64, 16, 32)
LATTICE_DENSE("dense_channel_float32_64x32", float, 64, 32, 32)
LATTICE_DENSE("dense_channel_float32_64x64", float, 64, 64, 32)
LATTICE_DENSE("dense_channel_float16_16x16", half, 16, 16, 32)
LATTICE_DENSE("dense_channel_float16_16x32", half, 16, 32, 32)
LATTICE_DENSE("dense_channel_float16_16x64", half, 16, 64, 32)
LATTICE_DENSE("dense_channel_float16_32x16", half, 32, 16, 32)
LATTICE_DENSE("dense_channel_float16_32x32", half, 32, 32, 32)
LATTICE_DENSE("dense_channel_float16_32x64", half, 32, 64, 32)
LATTICE_DENSE("dense_channel_float16_64x16", half, 64, 16, 32)
LATTICE_DENSE("dense_channel_float16_64x32", half, 64, 32, 32)
LATTICE_DENSE("dense_channel_float16_64x64", half, 64, 64, 32)

LATTICE_DENSE("dgrad_dense_grouped_float32_16x16", float, 16, 16, 64)
LATTICE_DENSE("dgrad_dense_grouped_float32_16x32", float, 16, 32, 64)
LATTICE_DENSE("dgrad_dense_grouped_float32_16x64", float, 16, 64, 64)
LATTICE_DENSE("dgrad_dense_grouped_float32_32x16", float, 32, 16, 64)
LATTICE_DENSE("dgrad_dense_grouped_float32_32x32", float, 32, 32, 64)
LATTICE_DENSE("dgrad_dense_grouped_float32_32x64", float, 32, 64, 64)
LATTICE_DENSE("dgrad_dense_grouped_float32_64x16", float, 64, 16, 64)
LATTICE_DENSE("dgrad_dense_grouped_float32_64x32", float, 64, 32, 64)
LATTICE_DENSE("dgrad_dense_grouped_float32_64x64", float, 64, 64, 64)
LATTICE_DENSE("dgrad_dense_grouped_float16_16x16", half, 16, 16, 64)
LATTICE_DENSE("dgrad_dense_grouped_float16_16x32", half, 16, 32, 64)
LATTICE_DENSE("dgrad_dense_grouped_float16_16x64", half, 16, 64, 64)
LATTICE_DENSE("dgrad_dense_grouped_float16_32x16", half, 32, 16, 64)
LATTICE_DENSE("dgrad_dense_grouped_float16_32x32", half, 32, 32, 64)
LATTICE_DENSE("dgrad_dense_grouped_float16_32x64", half, 32, 64, 64)
LATTICE_DENSE("dgrad_dense_grouped_float16_64x16", half, 64, 16, 64)
LATTICE_DENSE("dgrad_dense_grouped_float16_64x32", half, 64, 32, 64)
LATTICE_DENSE("dgrad_dense_grouped_float16_64x64", half, 64, 64, 64)
#define LATTICE_POINTWISE(name, T, BN) \
  template [[host_name(name)]] [[kernel]] decltype(pointwise_mma<T, BN>) pointwise_mma<T, BN>;

LATTICE_POINTWISE("pointwise_float32_n16", float, 16)
LATTICE_POINTWISE("pointwise_float32_n32", float, 32)
LATTICE_POINTWISE("pointwise_float32_n64", float, 64)
LATTICE_POINTWISE("pointwise_float16_n16", half, 16)
LATTICE_POINTWISE("pointwise_float16_n32", half, 32)
LATTICE_POINTWISE("pointwise_float16_n64", half, 64)
