// Valid neighbour of barrier_after_helper_return.metal for the strict pass (test_metal_strict.py):
// the bound checked around the memory accesses, not by returning; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

void stage(threadgroup float* tile, device float* y, uint t, uint n) {
  if (t < n) {
    tile[t] = y[t];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (t < n) {
    y[t] = tile[n - 1 - t];
  }
}

kernel void planted(
    device float* y [[buffer(0)]],
    constant uint& n [[buffer(1)]],
    uint t [[thread_index_in_threadgroup]]) {
  threadgroup float tile[64];
  stage(tile, y, t, n);
  y[t] += 1.0f;
}
