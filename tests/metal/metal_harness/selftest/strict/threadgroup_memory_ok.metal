// Valid neighbour of threadgroup_memory.metal for the strict pass (test_metal_strict.py):
// arrays that fit 32 KiB; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

template <typename T, int N>
[[kernel]] void planted(device T* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
  threadgroup T a[N];
  threadgroup T b[N];
  a[t] = y[t];
  b[t] = y[t + N];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[t] = a[N - 1 - t] + b[t];
}

template [[host_name("planted_float_4096")]] [[kernel]] decltype(planted<float, 4096>) planted<float, 4096>;
