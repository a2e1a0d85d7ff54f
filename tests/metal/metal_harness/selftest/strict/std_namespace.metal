// Planted defect for the strict pass (test_metal_strict.py): the C++ standard library through std::
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = std::max(y[i], 0.0f); // defect
}
