// Planted defect for the strict pass (test_metal_strict.py): an atomic
// operation on an atomic in thread memory (MSL, atomic functions: they
// take device or threadgroup atomics).
#include <metal_stdlib>
using namespace metal;

kernel void planted(device int* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  atomic_int local_count;
  atomic_store_explicit(&local_count, 0, memory_order_relaxed); // defect
  y[i] = 1;
}
