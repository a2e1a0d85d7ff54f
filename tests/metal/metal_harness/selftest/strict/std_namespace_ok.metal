// Valid neighbour of std_namespace.metal for the strict pass (test_metal_strict.py):
// metal::max; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = metal::max(y[i], 0.0f);
}
