// Valid neighbour of const_device_write.metal for the strict pass (test_metal_strict.py):
// a write through the writable pointer; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(
    device const float* x [[buffer(0)]],
    device float* y [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  y[i] = x[i];
  y[i] += x[i];
}
