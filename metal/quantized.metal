// Quantized convolution (int4/int8 affine codes, MLX packing): the direct
// packed route over any CSR view (float32, float16 or bfloat16 features,
// float arithmetic), and the sorted quantized implicit GEMM over the
// sorted plan. Programs: src/metal/quantized.cpp.
#include <metal_stdlib>

#include "quant_params.h"

using namespace metal;

// y[r, c] = sum over the edges e of row r of sum_g (s_g * sum_{a in g}
// x[a] q[a] + b_g * sum_{a in g} x[a]): the affine reconstruction applied
// per group, so each code is used once as an integer-valued float.
// One thread per (row, output channel); each output written once.
template <typename T, int BITS>
[[kernel]] void quantized_conv(
    device const T* x [[buffer(0)]],
    device const uint* codes [[buffer(1)]],
    device const float* scales [[buffer(2)]],
    device const float* biases [[buffer(3)]],
    device const int* offsets [[buffer(4)]],
    device const int* gather [[buffer(5)]],
    device const int* kidx [[buffer(6)]],
    device T* y [[buffer(7)]],
    constant QuantParams& p [[buffer(8)]],
    uint3 tid [[thread_position_in_grid]]) {
  const int c = int(tid.x);
  const int r = int(tid.y);
  if (r >= p.rows || c >= p.b) {
    return;
  }
  const int e0 = p.pointwise ? r : offsets[r];
  const int e1 = p.pointwise ? r + 1 : offsets[r + 1];
  const int groups = p.a / p.group;
  const int words = p.a * BITS / 32;
  float acc = 0.0f;
  for (int e = e0; e < e1; ++e) {
    const long g = p.pointwise ? r : gather[e];
    const long row = long(c) * p.k + (p.pointwise ? 0 : kidx[e]);
    device const T* xr = x + g * p.a;
    device const uint* wr = codes + row * words;
    for (int gi = 0; gi < groups; ++gi) {
      float xq = 0.0f, xsum = 0.0f;
      for (int a = gi * p.group; a < (gi + 1) * p.group; ++a) {
        const float xv = float(xr[a]);
        xq += xv * quant_code<BITS>(wr, a);
        xsum += xv;
      }
      acc += scales[row * groups + gi] * xq + biases[row * groups + gi] * xsum;
    }
  }
  y[long(r) * p.b + c] = T(acc);
}

constexpr constant int kTileRows = 64;
constexpr constant int kChunk = 32; // input channels staged per step

// Sorted quantized implicit GEMM (fp16): the tiles, masks and write-back
// of sorted_gemm.metal with W[k] dequantized into threadgroup memory, 32
// input channels at a time, as it is staged.
template <int CI, int CO, int BITS>
[[kernel]] void sorted_quantized(
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
    uint3 lid [[thread_position_in_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]) {
  // 16 KiB: staged x (64 x 32) and W (32 x CO); the 64 x CO tile afterwards.
  threadgroup float smem[kTileRows * 64];
  threadgroup float* xs = smem;
  threadgroup float* ws = smem + kTileRows * kChunk;
  const int tile = int(gid.x);
  const int t = int(lid.x);
  const int row0 = tile * kTileRows;
  const ulong mask = tile_masks[tile];

  simdgroup_float8x8 acc[2][CO / 8];
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < CO / 8; ++j) {
      acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    }
  }
  for (int k = 0; k < p.k; ++k) {
    if (((mask >> k) & 1) == 0) {
      continue; // no row of this tile has offset k
    }
    for (int c0 = 0; c0 < CI; c0 += kChunk) {
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (int i = t; i < kTileRows * kChunk; i += 128) {
        const int row = row0 + i / kChunk;
        const int in = row < p.rows ? sorted_map[long(row) * p.k + k] : -1;
        xs[i] = in >= 0 ? float(x[long(in) * CI + c0 + i % kChunk]) : 0.0f;
      }
      for (int i = t; i < kChunk * CO; i += 128) {
        ws[i] = quant_weight<BITS>(codes, scales, biases, p, i % CO, k, c0 + i / CO);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (int kk = 0; kk < kChunk; kk += 8) {
        simdgroup_float8x8 a[2];
        for (int i = 0; i < 2; ++i) {
          simdgroup_load(a[i], xs + (int(sg) * 16 + i * 8) * kChunk + kk, kChunk);
        }
        for (int j = 0; j < CO / 8; ++j) {
          simdgroup_float8x8 b;
          simdgroup_load(b, ws + kk * CO + j * 8, CO);
          for (int i = 0; i < 2; ++i) {
            simdgroup_multiply_accumulate(acc[i][j], a[i], b, acc[i][j]);
          }
        }
      }
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < CO / 8; ++j) {
      simdgroup_store(acc[i][j], smem + (int(sg) * 16 + i * 8) * CO + j * 8, CO);
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int i = t; i < kTileRows * CO; i += 128) {
    const int row = row0 + i / CO;
    if (row < p.rows) {
      y[long(reorder[row]) * CO + i % CO] = half(smem[i]);
    }
  }
}

template [[host_name("quantized_fetch_on_demand_float32_int4")]] [[kernel]] decltype(quantized_conv<float, 4>) quantized_conv<float, 4>;
template [[host_name("quantized_fetch_on_demand_float32_int8")]] [[kernel]] decltype(quantized_conv<float, 8>) quantized_conv<float, 8>;
template [[host_name("quantized_fetch_on_demand_float16_int4")]] [[kernel]] decltype(quantized_conv<half, 4>) quantized_conv<half, 4>;
template [[host_name("quantized_fetch_on_demand_float16_int8")]] [[kernel]] decltype(quantized_conv<half, 8>) quantized_conv<half, 8>;
template [[host_name("quantized_fetch_on_demand_bfloat16_int4")]] [[kernel]] decltype(quantized_conv<bfloat, 4>) quantized_conv<bfloat, 4>;
template [[host_name("quantized_fetch_on_demand_bfloat16_int8")]] [[kernel]] decltype(quantized_conv<bfloat, 8>) quantized_conv<bfloat, 8>;
template [[host_name("sorted_quantized_float16_32x32_int4")]] [[kernel]] decltype(sorted_quantized<32, 32, 4>) sorted_quantized<32, 32, 4>;
template [[host_name("sorted_quantized_float16_32x32_int8")]] [[kernel]] decltype(sorted_quantized<32, 32, 8>) sorted_quantized<32, 32, 8>;
template [[host_name("sorted_quantized_float16_32x64_int4")]] [[kernel]] decltype(sorted_quantized<32, 64, 4>) sorted_quantized<32, 64, 4>;
template [[host_name("sorted_quantized_float16_32x64_int8")]] [[kernel]] decltype(sorted_quantized<32, 64, 8>) sorted_quantized<32, 64, 8>;
template [[host_name("sorted_quantized_float16_64x32_int4")]] [[kernel]] decltype(sorted_quantized<64, 32, 4>) sorted_quantized<64, 32, 4>;
template [[host_name("sorted_quantized_float16_64x32_int8")]] [[kernel]] decltype(sorted_quantized<64, 32, 8>) sorted_quantized<64, 32, 8>;
template [[host_name("sorted_quantized_float16_64x64_int4")]] [[kernel]] decltype(sorted_quantized<64, 64, 4>) sorted_quantized<64, 64, 4>;
template [[host_name("sorted_quantized_float16_64x64_int8")]] [[kernel]] decltype(sorted_quantized<64, 64, 8>) sorted_quantized<64, 64, 8>;
