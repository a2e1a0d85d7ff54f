// Planted defect for the strict pass (test_metal_strict.py): a function-scope
// variable in device memory (MSL 4.1: device memory is reached through
// buffers, never declared in a function).
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  device float scratch; // defect
  y[i] = 1.0f;
}
