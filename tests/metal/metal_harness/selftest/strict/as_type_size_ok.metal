// Valid neighbour of as_type_size.metal for the strict pass (test_metal_strict.py):
// a half2 reinterpreted as 32 bits; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device uint* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  const half2 h = half2(1.0f);
  y[i] = as_type<uint>(h);
}
