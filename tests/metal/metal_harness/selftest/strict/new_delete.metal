// Planted defect for the strict pass (test_metal_strict.py): new and delete
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  thread float* p = new float(y[i]); // defect
  y[i] = *p;
}
