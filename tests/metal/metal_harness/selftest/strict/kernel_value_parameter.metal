// Planted defect for the strict pass (test_metal_strict.py): a kernel input
// passed by value without an attribute (a kernel's inputs are buffers,
// textures, samplers, threadgroup memory and built-in values).
#include <metal_stdlib>
using namespace metal;

kernel void planted( // defect
    device float* y [[buffer(0)]],
    uint n,
    uint i [[thread_position_in_grid]]) {
  y[i] *= float(n);
}
