// Valid neighbour of std_include.metal for the strict pass (test_metal_strict.py):
// a Metal header; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
#include <metal_array>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = 1.0f;
}
