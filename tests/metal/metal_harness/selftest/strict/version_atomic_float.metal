// Planted defect for the strict pass (test_metal_strict.py): atomic_float (Metal 3.0), checked at Metal 2.4 by the test
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  device atomic_float* a = (device atomic_float*)y; // defect
  atomic_fetch_add_explicit(a, 1.0f, memory_order_relaxed);
}
