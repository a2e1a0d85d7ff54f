// Planted defect for the strict pass (test_metal_strict.py): [[threadgroup(n)]]
// on a device pointer (it binds threadgroup memory only).
#include <metal_stdlib>
using namespace metal;

kernel void planted( // defect
    device float* y [[buffer(0)]],
    device float* scratch [[threadgroup(0)]],
    uint i [[thread_position_in_grid]]) {
  scratch[i] = y[i];
  y[i] = scratch[i] + 1.0f;
}
