// Valid neighbour of space_kernel_parameter.metal for the strict pass (test_metal_strict.py):
// a device pointer; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(
    device float* y [[buffer(0)]],
    uint i [[thread_position_in_grid]]) {
  y[i] = 1.0f;
}
