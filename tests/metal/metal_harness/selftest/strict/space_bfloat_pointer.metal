// Planted defect for the strict pass (test_metal_strict.py): a device
// bfloat pointer passed where a thread one is required.
#include <metal_stdlib>
using namespace metal;

void store(thread bfloat* dst, float v, uint i) {
  dst[i] = bfloat(v);
}

kernel void planted(device bfloat* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  store(y, 1.0f, i); // defect
}
