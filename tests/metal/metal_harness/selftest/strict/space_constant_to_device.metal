// Planted defect for the strict pass (test_metal_strict.py): a constant
// pointer passed where a device pointer is required.
#include <metal_stdlib>
using namespace metal;

float first(device const float* v) {
  return v[0];
}

kernel void planted(
    device float* y [[buffer(0)]],
    constant float* s [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  y[i] = first(s); // defect
}
