// Valid neighbour of space_vector_pointer.metal for the strict pass (test_metal_strict.py):
// a helper taking device memory; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

void stage(device float4* dst, float4 v, uint i) {
  dst[i] = v;
}

kernel void planted(device float4* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  stage(y, float4(1.0f), i);
}
