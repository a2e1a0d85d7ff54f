// Valid neighbour of threadgroup_device.metal for the strict pass
// (test_metal_strict.py): the device pointer bound as a buffer; Apple's
// compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(
    device float* y [[buffer(0)]],
    device float* scratch [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  scratch[i] = y[i];
  y[i] = scratch[i] + 1.0f;
}
