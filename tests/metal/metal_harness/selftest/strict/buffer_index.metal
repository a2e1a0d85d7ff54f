// Planted defect for the strict pass (test_metal_strict.py): a buffer index
// past the buffer argument table (31 entries, indices 0 to 30).
#include <metal_stdlib>
using namespace metal;

kernel void planted( // defect
    device float* y [[buffer(0)]],
    device const float* x [[buffer(31)]],
    uint i [[thread_position_in_grid]]) {
  y[i] = x[i];
}
