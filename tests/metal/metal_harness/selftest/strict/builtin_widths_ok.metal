// Valid neighbour of builtin_widths.metal for the strict pass (test_metal_strict.py):
// two 3-vectors; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(
    device float* y [[buffer(0)]],
    uint3 gid [[thread_position_in_grid]],
    uint3 group [[threadgroup_position_in_grid]]) {
  y[gid.x] = float(group.x);
}
