// Dense-channel routes: channel counts known at compile time, the offset's
// weights staged in threadgroup memory. Also the pointwise (1x1x1) GEMM.
// Programs: src/metal/forward_dense.cpp.
#include <metal_stdlib>

#include "params.h"

using namespace metal;

// (CO / 4) x R threads per group (256 in all): each thread owns 4 output
// channels of one row. Offsets are visited in order; W[k] (CI x CO) is
// loaded into threadgroup memory once per offset for the whole group.
template <typename T, int CI, int CO>
[[kernel]] void dense_channel(
    device const T* x [[buffer(0)]],
    device const T* w [[buffer(1)]],
    device const int* nmap [[buffer(2)]],
    device T* y [[buffer(3)]],
    constant ConvParams& p [[buffer(4)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint3 lid [[thread_position_in_threadgroup]],
    uint3 tpg [[threads_per_threadgroup]]) {
  threadgroup float ws[CI * CO];
  const int c4 = int(lid.x);
  const int r = int(gid.y * tpg.y + lid.y);
  const int t = int(lid.y * tpg.x + lid.x);
  const int nt = int(tpg.x * tpg.y);
  const bool active = r < p.rows;
  float4 acc = float4(0.0f);
  for (int k = 0; k < p.k; ++k) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
    device const T* wk = w + long(k) * CI * CO;
    for (int i = t; i < CI * CO; i += nt) {
      ws[i] = float(wk[i]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const int in = active ? nmap[long(r) * p.k + k] : -1;
    if (in >= 0) {
      device const T* xr = x + long(in) * CI;
      for (int a = 0; a < CI; ++a) {
        threadgroup const float* wa = ws + a * CO + 4 * c4;
        acc += float(xr[a]) * float4(wa[0], wa[1], wa[2], wa[3]);
      }
    }
  }
  if (active) {
    device T* yr = y + long(r) * CO + 4 * c4;
    yr[0] = T(acc.x);
    yr[1] = T(acc.y);
    yr[2] = T(acc.z);
    yr[3] = T(acc.w);
  }
}

// Pointwise product y = x @ W[0]: 16 x 16 output tiles, x and W staged in
// threadgroup memory 16 input channels at a time.
template <typename T>
[[kernel]] void pointwise_gemm(
    device const T* x [[buffer(0)]],
    device const T* w [[buffer(1)]],
    device T* y [[buffer(2)]],
    constant ConvParams& p [[buffer(3)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint3 lid [[thread_position_in_threadgroup]]) {
  threadgroup float xs[16][17];
  threadgroup float ws[16][17];
  const int c = int(gid.x) * 16 + int(lid.x);
  const int r = int(gid.y) * 16 + int(lid.y);
  float acc = 0.0f;
  for (int a0 = 0; a0 < p.a; a0 += 16) {
    const int xr = int(gid.y) * 16 + int(lid.y);
    const int xa = a0 + int(lid.x);
    xs[lid.y][lid.x] = (xr < p.rows && xa < p.a) ? float(x[long(xr) * p.a + xa]) : 0.0f;
    const int wa = a0 + int(lid.y);
    ws[lid.y][lid.x] = (wa < p.a && c < p.b) ? float(w[long(wa) * p.b + c]) : 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int i = 0; i < 16; ++i) {
      acc += xs[lid.y][i] * ws[i][lid.x];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (r < p.rows && c < p.b) {
    y[long(r) * p.b + c] = T(acc);
  }
}

// One instantiation per supported channel pair and dtype.
template [[host_name("dense_channel_float32_16x16")]] [[kernel]] decltype(dense_channel<float, 16, 16>) dense_channel<float, 16, 16>;
template [[host_name("dense_channel_float32_16x32")]] [[kernel]] decltype(dense_channel<float, 16, 32>) dense_channel<float, 16, 32>;
template [[host_name("dense_channel_float32_16x64")]] [[kernel]] decltype(dense_channel<float, 16, 64>) dense_channel<float, 16, 64>;
template [[host_name("dense_channel_float32_32x16")]] [[kernel]] decltype(dense_channel<float, 32, 16>) dense_channel<float, 32, 16>;
template [[host_name("dense_channel_float32_32x32")]] [[kernel]] decltype(dense_channel<float, 32, 32>) dense_channel<float, 32, 32>;
template [[host_name("dense_channel_float32_32x64")]] [[kernel]] decltype(dense_channel<float, 32, 64>) dense_channel<float, 32, 64>;
template [[host_name("dense_channel_float32_64x16")]] [[kernel]] decltype(dense_channel<float, 64, 16>) dense_channel<float, 64, 16>;
template [[host_name("dense_channel_float32_64x32")]] [[kernel]] decltype(dense_channel<float, 64, 32>) dense_channel<float, 64, 32>;
template [[host_name("dense_channel_float32_64x64")]] [[kernel]] decltype(dense_channel<float, 64, 64>) dense_channel<float, 64, 64>;
template [[host_name("dense_channel_float16_16x16")]] [[kernel]] decltype(dense_channel<half, 16, 16>) dense_channel<half, 16, 16>;
template [[host_name("dense_channel_float16_16x32")]] [[kernel]] decltype(dense_channel<half, 16, 32>) dense_channel<half, 16, 32>;
template [[host_name("dense_channel_float16_16x64")]] [[kernel]] decltype(dense_channel<half, 16, 64>) dense_channel<half, 16, 64>;
template [[host_name("dense_channel_float16_32x16")]] [[kernel]] decltype(dense_channel<half, 32, 16>) dense_channel<half, 32, 16>;
template [[host_name("dense_channel_float16_32x32")]] [[kernel]] decltype(dense_channel<half, 32, 32>) dense_channel<half, 32, 32>;
template [[host_name("dense_channel_float16_32x64")]] [[kernel]] decltype(dense_channel<half, 32, 64>) dense_channel<half, 32, 64>;
template [[host_name("dense_channel_float16_64x16")]] [[kernel]] decltype(dense_channel<half, 64, 16>) dense_channel<half, 64, 16>;
template [[host_name("dense_channel_float16_64x32")]] [[kernel]] decltype(dense_channel<half, 64, 32>) dense_channel<half, 64, 32>;
template [[host_name("dense_channel_float16_64x64")]] [[kernel]] decltype(dense_channel<half, 64, 64>) dense_channel<half, 64, 64>;

template [[host_name("pointwise_float32")]] [[kernel]] decltype(pointwise_gemm<float>) pointwise_gemm<float>;
template [[host_name("pointwise_float16")]] [[kernel]] decltype(pointwise_gemm<half>) pointwise_gemm<half>;
