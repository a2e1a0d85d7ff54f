// Valid neighbour of atomic_type.metal for the strict pass (test_metal_strict.py):
// atomic<int>; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device atomic<int>* counts [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  atomic_fetch_add_explicit(&counts[0], 1, memory_order_relaxed);
}
