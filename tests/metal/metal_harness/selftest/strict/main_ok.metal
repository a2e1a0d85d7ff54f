// Valid neighbour of main.metal for the strict pass (test_metal_strict.py):
// a function of another name; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

float main_value(float v) {
  return 2.0f * v;
}

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = 1.0f;
}
