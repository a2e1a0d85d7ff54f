// Planted defect for the strict pass (test_metal_strict.py): exceptions
#include <metal_stdlib>
using namespace metal;
float checked(float v) {
  if (v < 0.0f) {
    throw 1; // defect
  }
  return v;
}
kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = checked(y[i]);
}
