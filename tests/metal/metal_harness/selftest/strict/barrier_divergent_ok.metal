// Valid neighbour of barrier_divergent.metal for the strict pass (test_metal_strict.py):
// the barrier before the branch; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
  threadgroup float tile[64];
  tile[t] = y[t];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (t < 32) {
    y[t] = tile[63 - t];
  }
}
