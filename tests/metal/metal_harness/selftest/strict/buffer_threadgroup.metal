// Planted defect for the strict pass (test_metal_strict.py): [[buffer(n)]] on
// a threadgroup pointer (threadgroup memory binds with [[threadgroup(n)]]).
#include <metal_stdlib>
using namespace metal;

kernel void planted( // defect
    device float* y [[buffer(0)]],
    threadgroup float* tile [[buffer(1)]],
    uint i [[thread_index_in_threadgroup]]) {
  tile[i] = y[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[i] = tile[0];
}
