// Planted defect for the strict pass (test_metal_strict.py): a threadgroup reference bound to device memory
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  threadgroup float& r = y[i]; // defect
  r = 2.0f;
}
