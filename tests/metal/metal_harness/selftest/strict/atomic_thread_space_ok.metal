// Valid neighbour of atomic_thread_space.metal for the strict pass (test_metal_strict.py):
// an atomic in threadgroup memory; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device int* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  threadgroup atomic_int local_count;
  atomic_store_explicit(&local_count, 0, memory_order_relaxed);
  y[i] = 1;
}
