// Planted defect for the strict pass (test_metal_strict.py): the noexcept operator
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = noexcept(y[i] + 1.0f) ? 1.0f : 0.0f; // defect
}
