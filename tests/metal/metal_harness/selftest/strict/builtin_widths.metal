// Planted defect for the strict pass (test_metal_strict.py): vector built-in
// inputs of different widths in one kernel (MSL, attributes for kernel
// function inputs: their numbers of components match).
#include <metal_stdlib>
using namespace metal;

kernel void planted( // defect
    device float* y [[buffer(0)]],
    uint2 gid [[thread_position_in_grid]],
    uint3 group [[threadgroup_position_in_grid]]) {
  y[gid.x] = float(group.x);
}
