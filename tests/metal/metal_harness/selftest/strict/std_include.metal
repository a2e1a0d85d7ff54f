// Planted defect for the strict pass (test_metal_strict.py): a C++ standard
// library header.
#include <metal_stdlib>
#include <array> // defect
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = 1.0f;
}
