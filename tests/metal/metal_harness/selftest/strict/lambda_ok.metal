// Valid neighbour of lambda.metal for the strict pass (test_metal_strict.py):
// a function instead of a lambda (at Metal 3.x); Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  const float k = 2.0f;
  y[i] = k * y[i];
}
