// Planted defect for the strict pass (test_metal_strict.py): one built-in
// input declared twice, under its two names (thread_execution_width is
// threads_per_simdgroup).
#include <metal_stdlib>
using namespace metal;

kernel void planted( // defect
    device uint* y [[buffer(0)]],
    uint width [[thread_execution_width]],
    uint lanes [[threads_per_simdgroup]],
    uint i [[thread_position_in_grid]]) {
  y[i] = width + lanes;
}
