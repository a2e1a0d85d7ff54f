// Planted defect for the strict pass (test_metal_strict.py): thread_local storage
#include <metal_stdlib>
using namespace metal;
thread_local float scratch; // defect
kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = scratch;
}
