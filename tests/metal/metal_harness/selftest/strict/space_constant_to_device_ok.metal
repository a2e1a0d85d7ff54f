// Valid neighbour of space_constant_to_device.metal for the strict pass (test_metal_strict.py):
// a helper taking constant memory; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

float first(constant float* v) {
  return v[0];
}

kernel void planted(
    device float* y [[buffer(0)]],
    constant float* s [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  y[i] = first(s);
}
