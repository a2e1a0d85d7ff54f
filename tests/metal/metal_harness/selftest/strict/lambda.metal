// Planted defect for the strict pass (test_metal_strict.py): a lambda expression
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  auto twice = [](float v) { return 2.0f * v; }; // defect
  y[i] = twice(y[i]);
}
