// Planted defect for the strict pass (test_metal_strict.py): threadgroup
// arrays adding up to 64 KiB (Apple GPUs: 32 KiB of threadgroup memory).
#include <metal_stdlib>
using namespace metal;

template <typename T, int N>
[[kernel]] void planted(device T* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
  threadgroup T a[N];
  threadgroup T b[N]; // defect
  a[t] = y[t];
  b[t] = y[t + N];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[t] = a[N - 1 - t] + b[t];
}

template [[host_name("planted_float_8192")]] [[kernel]] decltype(planted<float, 8192>) planted<float, 8192>;
