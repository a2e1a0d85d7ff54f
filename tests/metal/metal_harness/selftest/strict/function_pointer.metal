// Planted defect for the strict pass (test_metal_strict.py): a pointer to
// an ordinary function (MSL 1.4.4: function pointers only to [[visible]]
// functions, from Metal 2.3, which the harness does not model).
#include <metal_stdlib>
using namespace metal;

float twice(float v) { return 2.0f * v; }

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  float (*op)(float) = twice; // defect
  y[i] = op(y[i]);
}
