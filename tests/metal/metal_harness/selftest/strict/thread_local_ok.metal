// Valid neighbour of thread_local.metal for the strict pass (test_metal_strict.py):
// a program-scope constant instead of thread_local; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;
constant float scratch = 0.0f;
kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = scratch;
}
