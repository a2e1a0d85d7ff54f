// Valid neighbour of long_long.metal for the strict pass (test_metal_strict.py):
// long (64 bits in MSL) instead of long long; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  long n = i;
  y[i] = float(n);
}
