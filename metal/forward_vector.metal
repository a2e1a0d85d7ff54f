// Forward routes over the CSR edges of a relation (any view): vec4, fp16
// gather, and the fp32 atomic route. Programs: src/metal/forward_vector.cpp.
#include <metal_stdlib>

#include "params.h"

using namespace metal;

// Row r's edge range; a pointwise product has the single edge (r, r, 0).
inline int2 edge_range(constant ConvParams& p, device const int* offsets, int r) {
  return p.pointwise ? int2(r, r + 1) : int2(offsets[r], offsets[r + 1]);
}

// vec4: one thread per (row, 4 output channels), float4 arithmetic.
template <typename T>
[[kernel]] void vec4_conv(
    device const T* x [[buffer(0)]],
    device const T* w [[buffer(1)]],
    device const int* offsets [[buffer(2)]],
    device const int* gather [[buffer(3)]],
    device const int* kidx [[buffer(4)]],
    device T* y [[buffer(5)]],
    constant ConvParams& p [[buffer(6)]],
    uint3 tid [[thread_position_in_grid]]) {
  const int c4 = int(tid.x);
  const int r = int(tid.y);
  const int nc4 = p.b / 4;
  if (r >= p.rows || c4 >= nc4) {
    return;
  }
  const int2 er = edge_range(p, offsets, r);
  float4 acc = float4(0.0f);
  for (int e = er.x; e < er.y; ++e) {
    const long g = p.pointwise ? r : gather[e];
    const long k = p.pointwise ? 0 : kidx[e];
    device const T* xr = x + g * p.a;
    device const T* wk = w + k * long(p.a) * p.b + 4 * c4;
    for (int a = 0; a < p.a; ++a) {
      device const T* wa = wk + long(a) * p.b;
      acc += float(xr[a]) * float4(float(wa[0]), float(wa[1]), float(wa[2]), float(wa[3]));
    }
  }
  device T* yr = y + long(r) * p.b + 4 * c4;
  yr[0] = T(acc.x);
  yr[1] = T(acc.y);
  yr[2] = T(acc.z);
  yr[3] = T(acc.w);
}

// fp16 gather: one simdgroup per output row. For each edge the lanes stage
// the input row in threadgroup memory, then each lane accumulates its output
// channels (lane, lane + 32, ...) in float.
constexpr constant int kGatherRows = 4;      // simdgroups (rows) per threadgroup
constexpr constant int kGatherMaxA = 1024;   // staged input channels per row
constexpr constant int kGatherChannels = 4;  // output channels per lane per pass

template <typename T>
[[kernel]] void fp16_gather_conv(
    device const T* x [[buffer(0)]],
    device const T* w [[buffer(1)]],
    device const int* offsets [[buffer(2)]],
    device const int* gather [[buffer(3)]],
    device const int* kidx [[buffer(4)]],
    device T* y [[buffer(5)]],
    constant ConvParams& p [[buffer(6)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint3 lid [[thread_position_in_threadgroup]]) {
  threadgroup T staged[kGatherRows * kGatherMaxA];
  const int lane = int(lid.x);
  const int slot = int(lid.y);
  const int r = int(gid.y) * kGatherRows + slot;
  if (r >= p.rows) {
    return; // the whole simdgroup leaves together
  }
  threadgroup T* xs = staged + slot * kGatherMaxA;
  const int2 er = edge_range(p, offsets, r);
  for (int c0 = 0; c0 < p.b; c0 += 32 * kGatherChannels) {
    float acc[kGatherChannels] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int e = er.x; e < er.y; ++e) {
      const long g = p.pointwise ? r : gather[e];
      const long k = p.pointwise ? 0 : kidx[e];
      for (int a0 = 0; a0 < p.a; a0 += kGatherMaxA) {
        const int na = min(kGatherMaxA, p.a - a0);
        simdgroup_barrier(mem_flags::mem_threadgroup);
        for (int a = lane; a < na; a += 32) {
          xs[a] = x[g * p.a + a0 + a];
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);
        device const T* wk = w + (k * p.a + a0) * long(p.b);
        for (int j = 0; j < kGatherChannels; ++j) {
          const int c = c0 + lane + 32 * j;
          if (c < p.b) {
            float s = 0.0f;
            for (int a = 0; a < na; ++a) {
              s += float(xs[a]) * float(wk[long(a) * p.b + c]);
            }
            acc[j] += s;
          }
        }
      }
    }
    for (int j = 0; j < kGatherChannels; ++j) {
      const int c = c0 + lane + 32 * j;
      if (c < p.b) {
        y[long(r) * p.b + c] = T(acc[j]);
      }
    }
  }
}

// fp32 atomic route, step 1: zero the output.
[[kernel]] void fill_zero_float32(
    device float* y [[buffer(0)]],
    constant int& count [[buffer(1)]],
    uint tid [[thread_position_in_grid]]) {
  if (int(tid) < count) {
    y[tid] = 0.0f;
  }
}

// fp32 atomic route, step 2: one thread per (edge, output channel) adds its
// product into the output row. Summation order varies: not deterministic.
template <typename T>
[[kernel]] void atomic_conv(
    device const T* x [[buffer(0)]],
    device const T* w [[buffer(1)]],
    device const int* gather [[buffer(2)]],
    device const int* kidx [[buffer(3)]],
    device const int* out_idx [[buffer(4)]],
    device atomic_float* y [[buffer(5)]],
    constant ConvParams& p [[buffer(6)]],
    uint3 tid [[thread_position_in_grid]]) {
  const int c = int(tid.x);
  const int e = int(tid.y);
  if (e >= p.edges || c >= p.b) {
    return;
  }
  device const T* xr = x + long(gather[e]) * p.a;
  device const T* wk = w + long(kidx[e]) * p.a * p.b + c;
  float s = 0.0f;
  for (int a = 0; a < p.a; ++a) {
    s += float(xr[a]) * float(wk[long(a) * p.b]);
  }
  atomic_fetch_add_explicit(&y[long(out_idx[e]) * p.b + c], s, memory_order_relaxed);
}

#define LATTICE_INSTANTIATE(name, fn, T) \
  template [[host_name(name)]] [[kernel]] decltype(fn<T>) fn<T>;

LATTICE_INSTANTIATE("vec4_float32", vec4_conv, float)
LATTICE_INSTANTIATE("fp16_gather_float16", fp16_gather_conv, half)
LATTICE_INSTANTIATE("fp32_atomic_float32", atomic_conv, float)
