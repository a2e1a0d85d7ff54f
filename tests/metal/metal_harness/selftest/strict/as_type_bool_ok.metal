// Valid neighbour of as_type_bool.metal for the strict pass
// (test_metal_strict.py): as_type between a uchar4 and a uint, then a
// comparison for the bool; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device uchar4* y [[buffer(0)]], device uint* z [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  const uint bits = as_type<uint>(y[i]);
  const bool b = bits != 0u;
  z[i] = b ? 1u : 0u;
  y[i] = as_type<uchar4>(z[i]);
}
