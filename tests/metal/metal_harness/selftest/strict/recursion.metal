// Planted defect for the strict pass (test_metal_strict.py): a recursive
// function (MSL 1.4.4, Restrictions: no recursive calls).
#include <metal_stdlib>
using namespace metal;

int depth(int n) {
  return n > 0 ? 1 + depth(n / 2) : 0; // defect
}

kernel void planted(device int* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = depth(y[i]);
}
