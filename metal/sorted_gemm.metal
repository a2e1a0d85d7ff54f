// Sorted fp16 implicit GEMM (direct route): output rows in neighbour-mask
// order, 64 rows per threadgroup, four simdgroups of 8x8 matrix tiles. For
// each offset present in the tile's mask, the gathered input rows and W[k]
// are staged (as float) 32 input channels at a time and multiplied into
// accumulators that stay in registers until the tile is written back in
// public row order. Programs: src/metal/sorted_gemm.cpp.
#include <metal_stdlib>

#include "params.h"

using namespace metal;

constexpr constant int kTileRows = 64;
constexpr constant int kChunk = 32; // input channels staged per step

template <typename T, int C>
[[kernel]] void sorted_gemm(
    device const T* x [[buffer(0)]],
    device const T* w [[buffer(1)]],
    device const int* reorder [[buffer(2)]],
    device const int* sorted_map [[buffer(3)]],
    device const ulong* tile_masks [[buffer(4)]],
    device T* y [[buffer(5)]],
    constant ConvParams& p [[buffer(6)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint3 lid [[thread_position_in_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]) {
  // 16 KiB: staged x (64 x 32) and W (32 x C) while accumulating; the
  // finished 64 x C tile afterwards.
  threadgroup float smem[kTileRows * 64];
  threadgroup float* xs = smem;
  threadgroup float* ws = smem + kTileRows * kChunk;
  const int tile = int(gid.x);
  const int t = int(lid.x);
  const int row0 = tile * kTileRows;
  const ulong mask = tile_masks[tile];

  simdgroup_float8x8 acc[2][C / 8];
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < C / 8; ++j) {
      acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    }
  }
  for (int k = 0; k < p.k; ++k) {
    if (((mask >> k) & 1) == 0) {
      continue; // no row of this tile has offset k
    }
    for (int c0 = 0; c0 < C; c0 += kChunk) {
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (int i = t; i < kTileRows * kChunk; i += 128) {
        const int rr = i / kChunk;
        const int row = row0 + rr;
        const int in = row < p.rows ? sorted_map[long(row) * p.k + k] : -1;
        xs[i] = in >= 0 ? float(x[long(in) * C + c0 + i % kChunk]) : 0.0f;
      }
      for (int i = t; i < kChunk * C; i += 128) {
        ws[i] = float(w[(long(k) * C + c0) * C + i]);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (int kk = 0; kk < kChunk; kk += 8) {
        simdgroup_float8x8 a[2];
        for (int i = 0; i < 2; ++i) {
          simdgroup_load(a[i], xs + (int(sg) * 16 + i * 8) * kChunk + kk, kChunk);
        }
        for (int j = 0; j < C / 8; ++j) {
          simdgroup_float8x8 b;
          simdgroup_load(b, ws + kk * C + j * 8, C);
          for (int i = 0; i < 2; ++i) {
            simdgroup_multiply_accumulate(acc[i][j], a[i], b, acc[i][j]);
          }
        }
      }
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < C / 8; ++j) {
      simdgroup_store(acc[i][j], smem + (int(sg) * 16 + i * 8) * C + j * 8, C);
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int i = t; i < kTileRows * C; i += 128) {
    const int row = row0 + i / C;
    if (row < p.rows) {
      y[long(reorder[row]) * C + i % C] = T(smem[i]);
    }
  }
}

template [[host_name("sorted_gemm_float16_c32")]] [[kernel]] decltype(sorted_gemm<half, 32>) sorted_gemm<half, 32>;
template [[host_name("sorted_gemm_float16_c64")]] [[kernel]] decltype(sorted_gemm<half, 64>) sorted_gemm<half, 64>;
