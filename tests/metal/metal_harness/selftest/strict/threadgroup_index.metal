// Planted defect for the strict pass (test_metal_strict.py): a threadgroup
// buffer index past the threadgroup memory argument table (indices 0 to 30).
#include <metal_stdlib>
using namespace metal;

kernel void planted( // defect
    device float* y [[buffer(0)]],
    threadgroup float* tile [[threadgroup(40)]],
    uint i [[thread_index_in_threadgroup]]) {
  tile[i] = y[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[i] = tile[0];
}
