// Valid neighbour of goto.metal for the strict pass (test_metal_strict.py):
// the early exit as a return; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  if (i > 4) {
    return;
  }
  y[i] = 1.0f;
done:
  return;
}
