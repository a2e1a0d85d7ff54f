// Valid neighbour of function_pointer.metal for the strict pass (test_metal_strict.py):
// a direct call; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

float twice(float v) { return 2.0f * v; }

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  const float v = y[i];
  y[i] = twice(v);
}
