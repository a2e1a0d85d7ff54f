// Planted defect for the strict pass (test_metal_strict.py): two kernel
// parameters bound at one buffer index.
#include <metal_stdlib>
using namespace metal;

kernel void planted( // defect
    device float* y [[buffer(1)]],
    device const float* x [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  y[i] = x[i];
}
