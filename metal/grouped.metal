// Grouped and depthwise products, float32 / float16 / bfloat16 features
// (float arithmetic): W is (K, ag, b) and output channel c reads the ag
// input channels of its group, [(c / bg) * ag, ...). Buffer bindings and
// dispatch shapes: the programs of the metal.grouped_fetch_on_demand and
// metal.grouped_wgrad routes in src/metal/grouped.cpp.
#include <metal_stdlib>

#include "params.h"

using namespace metal;

// y[r, c] = sum over the edges e of row r of
//     x[gather[e], j*ag : (j+1)*ag] . w[k[e], :, c],   j = c / bg.
// One thread per (row, output channel); each output written once, edges in
// CSR order.
template <typename T>
[[kernel]] void grouped_conv(
    device const T* x [[buffer(0)]],
    device const T* w [[buffer(1)]],
    device const int* offsets [[buffer(2)]],
    device const int* gather [[buffer(3)]],
    device const int* kidx [[buffer(4)]],
    device T* y [[buffer(5)]],
    constant GroupedParams& p [[buffer(6)]],
    uint3 tid [[thread_position_in_grid]]) {
  const int c = int(tid.x);
  const int r = int(tid.y);
  if (r >= p.rows || c >= p.b) {
    return;
  }
  const bool pointwise = p.pointwise_rows >= 0;
  const int e0 = pointwise ? r : offsets[r];
  const int e1 = pointwise ? r + 1 : offsets[r + 1];
  const int first = (c / p.bg) * p.ag;
  float acc = 0.0f;
  for (int e = e0; e < e1; ++e) {
    const long g = pointwise ? r : gather[e];
    const long k = pointwise ? 0 : kidx[e];
    device const T* xr = x + g * p.a + first;
    device const T* wk = w + k * long(p.ag) * p.b + c;
    for (int a = 0; a < p.ag; ++a) {
      acc += float(xr[a]) * float(wk[long(a) * p.b]);
    }
  }
  y[long(r) * p.b + c] = T(acc);
}

// dw[k, a, c] = sum over the edges of offset k of x[g, (c / bg) * ag + a] *
// ct[r, c]. One thread per weight element; edges in kernel-major order.
template <typename T>
[[kernel]] void grouped_weight_grad(
    device const T* x [[buffer(0)]],
    device const T* ct [[buffer(1)]],
    device const int* offsets [[buffer(2)]],
    device const int* g_idx [[buffer(3)]],
    device const int* r_idx [[buffer(4)]],
    device T* dw [[buffer(5)]],
    constant GroupedParams& p [[buffer(6)]],
    uint3 tid [[thread_position_in_grid]]) {
  const int c = int(tid.x);
  const int a = int(tid.y);
  const int k = int(tid.z);
  if (c >= p.b || a >= p.ag || k >= p.rows) {
    return;
  }
  const bool pointwise = p.pointwise_rows >= 0;
  const int e0 = pointwise ? 0 : offsets[k];
  const int e1 = pointwise ? p.pointwise_rows : offsets[k + 1];
  const long col = (c / p.bg) * p.ag + a;
  float acc = 0.0f;
  for (int e = e0; e < e1; ++e) {
    const long g = pointwise ? e : g_idx[e];
    const long r = pointwise ? e : r_idx[e];
    acc += float(x[g * p.a + col]) * float(ct[r * p.b + c]);
  }
  dw[(long(k) * p.ag + a) * p.b + c] = T(acc);
}

#define LATTICE_INSTANTIATE(name, fn, T) \
  template [[host_name(name)]] [[kernel]] decltype(fn<T>) fn<T>;

LATTICE_INSTANTIATE("grouped_fetch_on_demand_float32", grouped_conv, float)
LATTICE_INSTANTIATE("grouped_fetch_on_demand_float16", grouped_conv, half)
LATTICE_INSTANTIATE("grouped_fetch_on_demand_bfloat16", grouped_conv, bfloat)
LATTICE_INSTANTIATE("grouped_wgrad_float32", grouped_weight_grad, float)
LATTICE_INSTANTIATE("grouped_wgrad_float16", grouped_weight_grad, half)
LATTICE_INSTANTIATE("grouped_wgrad_bfloat16", grouped_weight_grad, bfloat)
