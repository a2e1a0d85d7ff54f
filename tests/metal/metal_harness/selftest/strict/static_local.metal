// Planted defect for the strict pass (test_metal_strict.py): a static local
// variable outside the constant address space (a program-scope object:
// MSL 4.2).
#include <metal_stdlib>
using namespace metal;

float next_value(float v) {
  static float last = 0.0f; // defect
  last += v;
  return last;
}

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = next_value(y[i]);
}
