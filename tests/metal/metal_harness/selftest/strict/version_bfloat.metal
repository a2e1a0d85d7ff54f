// Planted defect for the strict pass (test_metal_strict.py): bfloat (Metal 3.1), checked at Metal 3.0 by the test
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  bfloat b = bfloat(y[i]); // defect
  y[i] = float(b);
}
