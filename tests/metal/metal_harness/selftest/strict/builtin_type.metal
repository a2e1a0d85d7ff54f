// Planted defect for the strict pass (test_metal_strict.py): a built-in
// kernel input of a type its attribute does not take (MSL, attributes for
// kernel function inputs: positions are uint or ushort, scalar or vector).
#include <metal_stdlib>
using namespace metal;

kernel void planted( // defect
    device float* y [[buffer(0)]],
    int i [[thread_position_in_grid]]) {
  y[i] = 1.0f;
}
