// Valid neighbour of static_local.metal for the strict pass (test_metal_strict.py):
// the state passed in; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

float next_value(float v) {
  float last = 0.0f;
  last += v;
  return last;
}

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = next_value(y[i]);
}
