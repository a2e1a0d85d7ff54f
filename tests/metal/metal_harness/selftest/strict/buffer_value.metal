// Planted defect for the strict pass (test_metal_strict.py): [[buffer(n)]]
// on a value (MSL, attributes for kernel function inputs: a buffer binds a
// device or constant pointer or reference).
#include <metal_stdlib>
using namespace metal;

kernel void planted( // defect
    device float* y [[buffer(0)]],
    float s [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  y[i] *= s;
}
