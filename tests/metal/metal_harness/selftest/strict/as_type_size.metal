// Planted defect for the strict pass (test_metal_strict.py): as_type between
// types of different sizes (MSL, reinterpreting data: the
// sizes must match).
#include <metal_stdlib>
using namespace metal;

kernel void planted(device uint* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  const half h = half(1.0f);
  y[i] = as_type<uint>(h); // defect
}
