// Planted defect for the strict pass (test_metal_strict.py): a barrier that
// orders no memory (mem_none) under a condition on the thread, where the
// threads it turns away wrote threadgroup memory first: the threads inside
// then wait for no one they could rely on (every thread of the threadgroup
// must reach the barrier).
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
  threadgroup float tile[64];
  tile[t] = y[t];
  if (t < 32) {
    threadgroup_barrier(mem_flags::mem_none); // defect
    y[t] = y[t] * 2.0f;
  }
}
