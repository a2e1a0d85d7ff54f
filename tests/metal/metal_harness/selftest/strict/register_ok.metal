// Valid neighbour of register.metal for the strict pass (test_metal_strict.py):
// a plain local; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  float v = y[i];
  y[i] = v;
}
