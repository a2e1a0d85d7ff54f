// Planted defect for the strict pass (test_metal_strict.py): the register storage class
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  register float v = y[i]; // defect
  y[i] = v;
}
