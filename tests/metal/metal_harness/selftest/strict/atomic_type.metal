// Planted defect for the strict pass (test_metal_strict.py): an atomic of a
// type MSL has no atomic for (MSL, atomic data types: int, uint, bool,
// long, ulong and float).
#include <metal_stdlib>
using namespace metal;

kernel void planted(device atomic<short>* counts [[buffer(0)]], uint i [[thread_position_in_grid]]) { // defect
  atomic_fetch_add_explicit(&counts[0], short(1), memory_order_relaxed);
}
