// Planted defect for the strict pass (test_metal_strict.py): a simdgroup
// reduction called by part of a simdgroup (the harness requires every
// lane, as its executor does; MSL defines it over the active lanes).
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
  float v = y[lane];
  if (lane < 16) {
    v = simd_sum(v); // defect
  }
  y[lane] = v;
}
