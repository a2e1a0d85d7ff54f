// Valid neighbour of space_struct_reference.metal for the strict pass (test_metal_strict.py):
// a helper taking a constant reference; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

struct Affine {
  float scale;
  float shift;
};

float apply(constant Affine& a, float v) {
  return v * a.scale + a.shift;
}

kernel void planted(
    device float* y [[buffer(0)]],
    constant Affine& p [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  y[i] = apply(p, y[i]);
}
