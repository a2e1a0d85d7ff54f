// Planted defect for the strict pass (test_metal_strict.py): a function
// named main (MSL 1.4.4, Restrictions).
#include <metal_stdlib>
using namespace metal;

float main(float v) { // defect
  return 2.0f * v;
}

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = 1.0f;
}
