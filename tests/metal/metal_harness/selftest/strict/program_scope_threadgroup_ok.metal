// Valid neighbour of program_scope_threadgroup.metal for the strict pass (test_metal_strict.py):
// the threadgroup array in the kernel; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;


kernel void planted(device float* y [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
  threadgroup float shared_tile[64];
  shared_tile[i] = y[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[i] = shared_tile[63 - i];
}
