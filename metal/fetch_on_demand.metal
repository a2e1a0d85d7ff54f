// Fetch-on-demand: output-stationary sparse convolution and its weight
// gradient. Buffer bindings and dispatch shapes: the programs of the
// metal.fetch_on_demand and metal.wgrad_direct routes in
// src/metal/fetch_on_demand.cpp.
#include <metal_stdlib>

#include "params.h"

using namespace metal;

// y[r, c] = sum over the edges e of row r of x[gather[e], :] . w[k[e], :, c].
// One thread per (row, output channel); each output written once.
template <typename T>
[[kernel]] void gather_conv(
    device const T* x [[buffer(0)]],
    device const T* w [[buffer(1)]],
    device const int* offsets [[buffer(2)]],
    device const int* gather [[buffer(3)]],
    device const int* kidx [[buffer(4)]],
    device T* y [[buffer(5)]],
    constant ConvParams& p [[buffer(6)]],
    uint3 tid [[thread_position_in_grid]]) {
  const int c = int(tid.x);
  const int r = int(tid.y);
  if (r >= p.rows || c >= p.b) {
    return;
  }
  const int e0 = p.pointwise ? r : offsets[r];
  const int e1 = p.pointwise ? r + 1 : offsets[r + 1];
  float acc = 0.0f;
  for (int e = e0; e < e1; ++e) {
    const long g = p.pointwise ? r : gather[e];
    const long k = p.pointwise ? 0 : kidx[e];
    device const T* xr = x + g * p.a;
    device const T* wk = w + k * long(p.a) * p.b + c;
    for (int a = 0; a < p.a; ++a) {
      acc += float(xr[a]) * float(wk[long(a) * p.b]);
    }
  }
  y[long(r) * p.b + c] = T(acc);
}

// dw[k, a, c] = sum over the edges of offset k of x[g, a] * ct[r, c].
// One thread per weight element; edges visited in kernel-major order.
template <typename T>
[[kernel]] void weight_grad(
    device const T* x [[buffer(0)]],
    device const T* ct [[buffer(1)]],
    device const int* offsets [[buffer(2)]],
    device const int* g_idx [[buffer(3)]],
    device const int* r_idx [[buffer(4)]],
    device T* dw [[buffer(5)]],
    constant WeightGradParams& p [[buffer(6)]],
    uint3 tid [[thread_position_in_grid]]) {
  const int c = int(tid.x);
  const int a = int(tid.y);
  const int k = int(tid.z);
  if (c >= p.b || a >= p.a || k >= p.k) {
    return;
  }
  const bool pointwise = p.pointwise_rows >= 0;
  const int e0 = pointwise ? 0 : offsets[k];
  const int e1 = pointwise ? p.pointwise_rows : offsets[k + 1];
  float acc = 0.0f;
  for (int e = e0; e < e1; ++e) {
    const long g = pointwise ? e : g_idx[e];
    const long r = pointwise ? e : r_idx[e];
    acc += float(x[g * p.a + a]) * float(ct[r * p.b + c]);
  }
  dw[(long(k) * p.a + a) * p.b + c] = T(acc);
}

#define LATTICE_INSTANTIATE(name, fn, T) \
  template [[host_name(name)]] [[kernel]] decltype(fn<T>) fn<T>;

LATTICE_INSTANTIATE("fetch_on_demand_float32", gather_conv, float)
LATTICE_INSTANTIATE("fetch_on_demand_float16", gather_conv, half)
LATTICE_INSTANTIATE("wgrad_direct_float32", weight_grad, float)
LATTICE_INSTANTIATE("wgrad_direct_float16", weight_grad, half)
