// Valid neighbour of threadgroup_initializer.metal for the strict pass (test_metal_strict.py):
// the threadgroup variable set by one thread; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device int* y [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
  threadgroup int count;
  if (i == 0) {
    count = 1;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[i] = count;
}
