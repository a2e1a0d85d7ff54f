// Planted defect for the strict pass (test_metal_strict.py): a device pointer assigned to a thread pointer
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  thread float* p = y; // defect
  p[i] = 1.0f;
}
