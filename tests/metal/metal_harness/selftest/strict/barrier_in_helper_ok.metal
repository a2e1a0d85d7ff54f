// Valid neighbour of barrier_in_helper.metal for the strict pass (test_metal_strict.py):
// a loop trip count the same in every thread; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

void sync_group() {
  threadgroup_barrier(mem_flags::mem_threadgroup);
}

kernel void planted(
    device float* y [[buffer(0)]],
    constant int& n [[buffer(1)]],
    uint t [[thread_index_in_threadgroup]]) {
  for (int i = 0; i < n; i += 64) {
    y[i + int(t)] *= 2.0f;
    sync_group();
  }
}
