// Planted defect for the strict pass (test_metal_strict.py): a write to
// constant memory (MSL 4.2: the constant address space is read-only).
#include <metal_stdlib>
using namespace metal;

struct Params {
  int n;
  float scale;
};

kernel void planted(
    device float* y [[buffer(0)]],
    constant Params& p [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  y[i] *= p.scale;
  p.scale = 1.0f; // defect
}
