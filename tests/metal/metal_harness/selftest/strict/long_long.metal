// Planted defect for the strict pass (test_metal_strict.py): long long,
// which MSL does not have.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  long long n = i; // defect
  y[i] = float(n);
}
