// Planted defect for the strict pass (test_metal_strict.py): a threadgroup
// barrier under a condition on the thread's index (MSL, synchronization
// functions: every thread of the threadgroup executes threadgroup_barrier).
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
  threadgroup float tile[64];
  tile[t] = y[t];
  if (t < 32) {
    threadgroup_barrier(mem_flags::mem_threadgroup); // defect
    y[t] = tile[63 - t];
  }
}
