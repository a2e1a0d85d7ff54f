// Planted defect for the strict pass (test_metal_strict.py): as_type to bool
// (MSL, as_type: the source and destination are scalar or vector types
// other than bool, of one size).
#include <metal_stdlib>
using namespace metal;

kernel void planted(device uchar* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  const bool b = as_type<bool>(y[i]); // defect
  y[i] = b ? 1 : 0;
}
