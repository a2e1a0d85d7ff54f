// Planted defect for the strict pass (test_metal_strict.py): a swizzle mixing
// the xyzw and the rgba letters (MSL refuses it).
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float4* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  const float4 a = y[i];
  y[i] = float4(a.xg, a.zw); // defect
}
