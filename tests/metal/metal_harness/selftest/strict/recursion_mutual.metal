// Refused by the strict pass below Metal 2.4 (test_metal_strict.py): two
// functions calling each other, one through a template (MSL 1.4.4 up to
// 2.3: no recursion; the file builds at 3.1).
#include <metal_stdlib>
using namespace metal;

int odd_steps(int n);

template <typename T>
int even_steps(T n) {
  return n > 0 ? odd_steps(int(n) - 1) : 0; // defect
}

int odd_steps(int n) {
  return n > 0 ? 1 + even_steps(n - 1) : 0;
}

kernel void planted(device int* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = even_steps(y[i]);
}
