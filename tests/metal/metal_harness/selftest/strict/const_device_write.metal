// Planted defect for the strict pass (test_metal_strict.py): a write through
// a pointer to const device memory.
#include <metal_stdlib>
using namespace metal;

kernel void planted(
    device const float* x [[buffer(0)]],
    device float* y [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  y[i] = x[i];
  x[i] = 0.0f; // defect
}
