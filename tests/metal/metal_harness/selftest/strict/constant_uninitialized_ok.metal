// Valid neighbour of constant_uninitialized.metal for the strict pass (test_metal_strict.py):
// an initialised constant; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

constant float kOffsets[4] = {0.0f, 1.0f, 2.0f, 3.0f};

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] += kOffsets[i % 4];
}
