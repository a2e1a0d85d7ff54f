// Valid neighbour of program_scope_plain.metal for the strict pass (test_metal_strict.py):
// a constexpr constant; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

constexpr constant float kScale = 2.0f;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] *= kScale;
}
