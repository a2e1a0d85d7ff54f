// Planted defect for the strict pass (test_metal_strict.py): tensors in a file compiled below Metal 4.0 (no tensorops_ prefix)
#include <metal_stdlib>
using namespace metal;
#include <metal_tensor> // defect
kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = 1.0f;
}
