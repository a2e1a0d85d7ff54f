// Valid neighbour of kernel_value_parameter.metal for the strict pass
// (test_metal_strict.py): the count as a constant reference without an
// attribute (bound to the next free buffer index); Apple's compiler accepts
// it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(
    device float* y [[buffer(0)]],
    constant uint& n,
    uint i [[thread_position_in_grid]]) {
  y[i] *= float(n);
}
