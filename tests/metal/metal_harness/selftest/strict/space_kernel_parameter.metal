// Planted defect for the strict pass (test_metal_strict.py): a kernel
// pointer argument without an address space.
#include <metal_stdlib>
using namespace metal;

kernel void planted(
    float* y [[buffer(0)]], // defect
    uint i [[thread_position_in_grid]]) {
  y[i] = 1.0f;
}
