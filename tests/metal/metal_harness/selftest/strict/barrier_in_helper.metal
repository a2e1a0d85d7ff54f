// Planted defect for the strict pass (test_metal_strict.py): a helper that
// synchronises the threadgroup, called by some of its threads: a loop
// whose trip count depends on the thread (MSL, synchronization functions).
#include <metal_stdlib>
using namespace metal;

void sync_group() {
  threadgroup_barrier(mem_flags::mem_threadgroup);
}

kernel void planted(
    device float* y [[buffer(0)]],
    constant int& n [[buffer(1)]],
    uint t [[thread_index_in_threadgroup]]) {
  for (int i = int(t); i < n; i += 64) {
    y[i] *= 2.0f;
    sync_group(); // defect
  }
}
