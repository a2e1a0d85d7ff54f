// Planted defect for the strict pass (test_metal_strict.py): type identification
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = float(sizeof(typeid(y[i]))); // defect
}
