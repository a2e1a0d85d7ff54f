// Valid neighbour of exceptions.metal for the strict pass (test_metal_strict.py):
// a clamp instead of a throw; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;
float checked(float v) {
  if (v < 0.0f) {
    return 0.0f;
  }
  return v;
}
kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = checked(y[i]);
}
