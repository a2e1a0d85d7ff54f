// Planted defect for the strict pass (test_metal_strict.py): a device
// vector pointer passed where a threadgroup one is required.
#include <metal_stdlib>
using namespace metal;

void stage(threadgroup float4* dst, float4 v, uint i) {
  dst[i] = v;
}

kernel void planted(device float4* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  stage(y, float4(1.0f), i); // defect
}
