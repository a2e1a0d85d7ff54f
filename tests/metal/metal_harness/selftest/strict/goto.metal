// Planted defect for the strict pass (test_metal_strict.py): goto
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  if (i > 4) {
    goto done; // defect
  }
  y[i] = 1.0f;
done:
  return;
}
