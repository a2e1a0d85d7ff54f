// Planted defect for the strict pass (test_metal_strict.py): a constant
// variable without an initializer (MSL 4.2: initialised where declared).
#include <metal_stdlib>
using namespace metal;

constant float kOffsets[4]; // defect

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] += kOffsets[i % 4];
}
