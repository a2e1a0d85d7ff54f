// Refused by the strict pass below Metal 2.4 (test_metal_strict.py): a recursive
// function (MSL 1.4.4 up to 2.3, Restrictions: no recursive calls; 2.4 and
// later list no such restriction, so the file builds at 3.1).
#include <metal_stdlib>
using namespace metal;

int depth(int n) {
  return n > 0 ? 1 + depth(n / 2) : 0; // defect
}

kernel void planted(device int* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = depth(y[i]);
}
