// Valid neighbour of double.metal for the strict pass (test_metal_strict.py):
// float instead of double; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  float d = y[i];
  y[i] = float(d);
}
