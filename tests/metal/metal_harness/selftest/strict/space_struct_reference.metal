// Planted defect for the strict pass (test_metal_strict.py): a constant
// struct passed where a device reference is required.
#include <metal_stdlib>
using namespace metal;

struct Affine {
  float scale;
  float shift;
};

float apply(device const Affine& a, float v) {
  return v * a.scale + a.shift;
}

kernel void planted(
    device float* y [[buffer(0)]],
    constant Affine& p [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  y[i] = apply(p, y[i]); // defect
}
