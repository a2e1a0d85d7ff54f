// Planted defect for the strict pass (test_metal_strict.py): two kernels of
// one name (MSL 1.4.1, Overloading: kernel functions are not overloaded).
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = 1.0f;
}

kernel void planted(device int* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { // defect
  y[i] = 1;
}
