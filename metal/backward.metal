// Backward routes: the classic weight-gradient kernels, and the ordered
// reduction of the partitioned ones. Programs (buffer bindings, dispatch
// shapes): src/metal/backward.cpp. (The input-gradient kernels of the
// dense-channel family are forward_dense.metal's.)
#include <metal_stdlib>

#include "params.h"

using namespace metal;

// Edge range and (gather, result) rows of edge e, relation or pointwise.
struct EdgeRange {
  int e0, e1;
};
inline EdgeRange edge_range(constant WeightGradParams& p, device const int* offsets, int k) {
  if (p.pointwise_rows >= 0) {
    return {0, p.pointwise_rows};
  }
  return {offsets[k], offsets[k + 1]};
}

constexpr constant int kStage = 32; // edges staged per step

// fp16 weight gradient: a (32 output x 8 input channels) block of dW[k] per
// threadgroup; 32 edges at a time, their x and ct entries are converted to
// float once into threadgroup memory and shared by the block.
[[kernel]] void wgrad_fp16(
    device const half* x [[buffer(0)]],
    device const half* ct [[buffer(1)]],
    device const int* offsets [[buffer(2)]],
    device const int* g_idx [[buffer(3)]],
    device const int* r_idx [[buffer(4)]],
    device half* dw [[buffer(5)]],
    constant WeightGradParams& p [[buffer(6)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint3 lid [[thread_position_in_threadgroup]]) {
  threadgroup float xs[kStage][8];
  threadgroup float cs[kStage][32];
  const int k = int(gid.z);
  const int c = int(gid.x) * 32 + int(lid.x);
  const int a = int(gid.y) * 8 + int(lid.y);
  const int t = int(lid.y) * 32 + int(lid.x);
  const bool pw = p.pointwise_rows >= 0;
  const EdgeRange er = edge_range(p, offsets, k);
  float acc = 0.0f;
  for (int e0 = er.e0; e0 < er.e1; e0 += kStage) {
    const int n = min(kStage, er.e1 - e0);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int i = t; i < kStage * 8; i += 256) {
      const int e = i / 8, aa = int(gid.y) * 8 + i % 8;
      const long g = e < n ? (pw ? e0 + e : g_idx[e0 + e]) : 0;
      xs[e][i % 8] = (e < n && aa < p.a) ? float(x[g * p.a + aa]) : 0.0f;
    }
    for (int i = t; i < kStage * 32; i += 256) {
      const int e = i / 32, cc = int(gid.x) * 32 + i % 32;
      const long r = e < n ? (pw ? e0 + e : r_idx[e0 + e]) : 0;
      cs[e][i % 32] = (e < n && cc < p.b) ? float(ct[r * p.b + cc]) : 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int e = 0; e < n; ++e) {
      acc += xs[e][lid.y] * cs[e][lid.x];
    }
  }
  if (c < p.b && a < p.a) {
    dw[(long(k) * p.a + a) * p.b + c] = half(acc);
  }
}

// C_out == 16: one thread per (offset, input channel) computing all 16
// output channels from float4 reads of the cotangent row.
template <typename T>
[[kernel]] void wgrad_cout16(
    device const T* x [[buffer(0)]],
    device const T* ct [[buffer(1)]],
    device const int* offsets [[buffer(2)]],
    device const int* g_idx [[buffer(3)]],
    device const int* r_idx [[buffer(4)]],
    device T* dw [[buffer(5)]],
    constant WeightGradParams& p [[buffer(6)]],
    uint3 tid [[thread_position_in_grid]]) {
  const int a = int(tid.x);
  const int k = int(tid.z);
  if (a >= p.a || k >= p.k) {
    return;
  }
  const bool pw = p.pointwise_rows >= 0;
  const EdgeRange er = edge_range(p, offsets, k);
  float4 acc[4] = {float4(0.0f), float4(0.0f), float4(0.0f), float4(0.0f)};
  for (int e = er.e0; e < er.e1; ++e) {
    const long g = pw ? e : g_idx[e];
    const long r = pw ? e : r_idx[e];
    const float xv = float(x[g * p.a + a]);
    device const T* cr = ct + r * 16;
    for (int j = 0; j < 4; ++j) {
      acc[j] += xv * float4(float(cr[4 * j]), float(cr[4 * j + 1]), float(cr[4 * j + 2]), float(cr[4 * j + 3]));
    }
  }
  device T* out = dw + (long(k) * p.a + a) * 16;
  for (int j = 0; j < 4; ++j) {
    out[4 * j] = T(acc[j].x);
    out[4 * j + 1] = T(acc[j].y);
    out[4 * j + 2] = T(acc[j].z);
    out[4 * j + 3] = T(acc[j].w);
  }
}

// Channels divisible by 4 (float32): one thread per 4 x 4 block of dW[k],
// float4 reads of x and ct, an outer product per edge.
[[kernel]] void wgrad_block4(
    device const float* x [[buffer(0)]],
    device const float* ct [[buffer(1)]],
    device const int* offsets [[buffer(2)]],
    device const int* g_idx [[buffer(3)]],
    device const int* r_idx [[buffer(4)]],
    device float* dw [[buffer(5)]],
    constant WeightGradParams& p [[buffer(6)]],
    uint3 tid [[thread_position_in_grid]]) {
  const int c4 = int(tid.x);
  const int a4 = int(tid.y);
  const int k = int(tid.z);
  if (4 * c4 >= p.b || 4 * a4 >= p.a || k >= p.k) {
    return;
  }
  const bool pw = p.pointwise_rows >= 0;
  const EdgeRange er = edge_range(p, offsets, k);
  float4 acc[4] = {float4(0.0f), float4(0.0f), float4(0.0f), float4(0.0f)};
  for (int e = er.e0; e < er.e1; ++e) {
    const long g = pw ? e : g_idx[e];
    const long r = pw ? e : r_idx[e];
    const float4 xv = *(device const float4*)(x + g * p.a + 4 * a4);
    const float4 cv = *(device const float4*)(ct + r * p.b + 4 * c4);
    acc[0] += xv.x * cv;
    acc[1] += xv.y * cv;
    acc[2] += xv.z * cv;
    acc[3] += xv.w * cv;
  }
  for (int i = 0; i < 4; ++i) {
    *(device float4*)(dw + (long(k) * p.a + 4 * a4 + i) * p.b + 4 * c4) = acc[i];
  }
}

// C_in == C_out == C in {16, 32, 64}: one threadgroup of 256 threads per
// offset; 32 edges of x and ct rows staged (as float) per step, each thread
// owning C * C / 256 elements of dW[k].
template <typename T, int C>
[[kernel]] void wgrad_dense_square(
    device const T* x [[buffer(0)]],
    device const T* ct [[buffer(1)]],
    device const int* offsets [[buffer(2)]],
    device const int* g_idx [[buffer(3)]],
    device const int* r_idx [[buffer(4)]],
    device T* dw [[buffer(5)]],
    constant WeightGradParams& p [[buffer(6)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]]) {
  constexpr int kPer = C * C / 256;
  threadgroup float xs[kStage * C];
  threadgroup float cs[kStage * C];
  const int k = int(gid.z);
  const int t = int(lid);
  const bool pw = p.pointwise_rows >= 0;
  const EdgeRange er = edge_range(p, offsets, k);
  float acc[kPer];
  for (int j = 0; j < kPer; ++j) {
    acc[j] = 0.0f;
  }
  for (int e0 = er.e0; e0 < er.e1; e0 += kStage) {
    const int n = min(kStage, er.e1 - e0);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int i = t; i < kStage * C; i += 256) {
      const int e = i / C;
      const long g = e < n ? (pw ? e0 + e : g_idx[e0 + e]) : 0;
      const long r = e < n ? (pw ? e0 + e : r_idx[e0 + e]) : 0;
      xs[i] = e < n ? float(x[g * C + i % C]) : 0.0f;
      cs[i] = e < n ? float(ct[r * C + i % C]) : 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int j = 0; j < kPer; ++j) {
      const int o = t + 256 * j;
      const int a = o / C, c = o % C;
      float s = 0.0f;
      for (int e = 0; e < n; ++e) {
        s += xs[e * C + a] * cs[e * C + c];
      }
      acc[j] += s;
    }
  }
  for (int j = 0; j < kPer; ++j) {
    dw[long(k) * C * C + t + 256 * j] = T(acc[j]);
  }
}

// Second step of the partitioned weight gradients (tensorops_backward.metal,
// wgrad_mma.metal): dw[k, i] = sum over p = 0 .. parts - 1, in order, of the
// float partials.
template <typename T>
[[kernel]] void wgrad_reduce(
    device const float* partials [[buffer(0)]],
    device T* dw [[buffer(1)]],
    constant WeightGradPartsParams& p [[buffer(2)]],
    uint3 tid [[thread_position_in_grid]]) {
  const int i = int(tid.x);
  const int k = int(tid.y);
  const int ab = p.a * p.b;
  if (i >= ab || k >= p.k) {
    return;
  }
  float s = 0.0f;
  for (int q = 0; q < p.parts; ++q) {
    s += partials[(long(k) * p.parts + q) * ab + i];
  }
  dw[long(k) * ab + i] = T(s);
}

template [[host_name("wgrad_reduce_float32")]] [[kernel]] decltype(wgrad_reduce<float>) wgrad_reduce<float>;
template [[host_name("wgrad_reduce_float16")]] [[kernel]] decltype(wgrad_reduce<half>) wgrad_reduce<half>;
// bfloat16: the second step of metal.wgrad_mma (wgrad_mma.metal).
template [[host_name("wgrad_reduce_bfloat16")]] [[kernel]] decltype(wgrad_reduce<bfloat>) wgrad_reduce<bfloat>;


template [[host_name("wgrad_cout16_float32")]] [[kernel]] decltype(wgrad_cout16<float>) wgrad_cout16<float>;
template [[host_name("wgrad_cout16_float16")]] [[kernel]] decltype(wgrad_cout16<half>) wgrad_cout16<half>;
template [[host_name("wgrad_dense_square_float32_c16")]] [[kernel]] decltype(wgrad_dense_square<float, 16>) wgrad_dense_square<float, 16>;
template [[host_name("wgrad_dense_square_float32_c32")]] [[kernel]] decltype(wgrad_dense_square<float, 32>) wgrad_dense_square<float, 32>;
template [[host_name("wgrad_dense_square_float32_c64")]] [[kernel]] decltype(wgrad_dense_square<float, 64>) wgrad_dense_square<float, 64>;
template [[host_name("wgrad_dense_square_float16_c16")]] [[kernel]] decltype(wgrad_dense_square<half, 16>) wgrad_dense_square<half, 16>;
template [[host_name("wgrad_dense_square_float16_c32")]] [[kernel]] decltype(wgrad_dense_square<half, 32>) wgrad_dense_square<half, 32>;
template [[host_name("wgrad_dense_square_float16_c64")]] [[kernel]] decltype(wgrad_dense_square<half, 64>) wgrad_dense_square<half, 64>;
