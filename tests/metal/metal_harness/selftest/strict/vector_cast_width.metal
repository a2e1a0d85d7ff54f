// Planted defect for the strict pass (test_metal_strict.py): a cast between
// vectors of different numbers of components (MSL converts vectors of one
// width only).
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float4* y [[buffer(0)]], device int2* z [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  y[i] = static_cast<float4>(z[i]); // defect
}
