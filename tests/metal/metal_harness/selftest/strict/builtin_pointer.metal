// Planted defect for the strict pass (test_metal_strict.py): a built-in input
// declared as a device pointer (built-ins are thread values of uint, ushort or
// their vectors).
#include <metal_stdlib>
using namespace metal;

kernel void planted( // defect
    device float* y [[buffer(0)]],
    device uint* i [[thread_position_in_grid]]) {
  y[*i] *= 2.0f;
}
