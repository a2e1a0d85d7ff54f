// Valid neighbour of threadgroup_in_helper.metal for the strict pass (test_metal_strict.py):
// the threadgroup array in the kernel, passed to the helper; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

float reverse_in_group(threadgroup float* tile, float v, uint i) {
  tile[i] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return tile[31 - i];
}

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
  threadgroup float tile[32];
  y[i] = reverse_in_group(tile, y[i], i);
}
