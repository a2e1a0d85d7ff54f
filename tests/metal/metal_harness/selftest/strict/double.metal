// Planted defect for the strict pass (test_metal_strict.py): double, which MSL does not have
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  double d = y[i]; // defect
  y[i] = float(d);
}
