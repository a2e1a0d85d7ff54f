// Valid neighbour of threadgroup_index.metal for the strict pass (test_metal_strict.py):
// index 30; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(
    device float* y [[buffer(0)]],
    threadgroup float* tile [[threadgroup(30)]],
    uint i [[thread_index_in_threadgroup]]) {
  tile[i] = y[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[i] = tile[0];
}
