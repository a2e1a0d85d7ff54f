// Valid neighbour of space_reference.metal for the strict pass (test_metal_strict.py):
// a device reference; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  device float& r = y[i];
  r = 2.0f;
}
