// Valid neighbour of noexcept.metal for the strict pass (test_metal_strict.py):
// a noexcept function declaration (a specifier, not the operator); Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

float twice(float v) noexcept { return 2.0f * v; }

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = twice(y[i]);
}
