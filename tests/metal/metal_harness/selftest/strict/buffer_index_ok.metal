// Valid neighbour of buffer_index.metal for the strict pass (test_metal_strict.py):
// index 30, the table's last; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(
    device float* y [[buffer(0)]],
    device const float* x [[buffer(30)]],
    uint i [[thread_position_in_grid]]) {
  y[i] = x[i];
}
