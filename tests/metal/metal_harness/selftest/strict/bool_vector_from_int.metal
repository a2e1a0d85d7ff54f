// Planted defect for the strict pass (test_metal_strict.py): an int4 assigned
// to a bool4 (MSL converts between vector types only explicitly; a
// comparison gives a bool vector).
#include <metal_stdlib>
using namespace metal;

kernel void planted(device int4* z [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  const int4 v = z[i];
  bool4 b = v; // defect
  z[i] = select(int4(0), int4(1), b);
}
