// Planted defect for the strict pass (test_metal_strict.py): a kernel that
// returns a value (MSL, kernel functions: a kernel returns void).
#include <metal_stdlib>
using namespace metal;

kernel float planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { // defect
  y[i] = 1.0f;
  return y[i];
}
