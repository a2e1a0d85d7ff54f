// Valid neighbour of builtin_pointer.metal for the strict pass
// (test_metal_strict.py): the position as a ushort value; Apple's compiler
// accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(
    device float* y [[buffer(0)]],
    ushort i [[thread_position_in_grid]]) {
  y[i] *= 2.0f;
}
