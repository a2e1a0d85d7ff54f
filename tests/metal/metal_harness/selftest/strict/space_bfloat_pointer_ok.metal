// Valid neighbour of space_bfloat_pointer.metal for the strict pass (test_metal_strict.py):
// a helper taking device memory; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

void store(device bfloat* dst, float v, uint i) {
  dst[i] = bfloat(v);
}

kernel void planted(device bfloat* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  store(y, 1.0f, i);
}
