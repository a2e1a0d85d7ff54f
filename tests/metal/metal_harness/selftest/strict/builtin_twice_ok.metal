// Valid neighbour of builtin_twice.metal for the strict pass (test_metal_strict.py):
// the width once; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(
    device uint* y [[buffer(0)]],
    uint lanes [[threads_per_simdgroup]],
    uint i [[thread_position_in_grid]]) {
  y[i] = lanes;
}
