// Valid neighbour of buffer_value.metal for the strict pass
// (test_metal_strict.py): the scale as a constant reference; Apple's compiler
// accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(
    device float* y [[buffer(0)]],
    constant float& s [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  y[i] *= s;
}
