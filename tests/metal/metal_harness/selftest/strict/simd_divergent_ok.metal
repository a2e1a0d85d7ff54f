// Accepted by the strict pass (test_metal_strict.py): a simdgroup reduction
// called by part of a simdgroup. MSL defines the SIMD-group functions over
// the active lanes (MLX's dot.h reduces in the first lanes only); the
// executor's `strict` option still wants every lane.
#include <metal_stdlib>
using namespace metal;

kernel void accepted(device float* y [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
  float v = y[lane];
  if (lane < 16) {
    v = simd_sum(v);
  }
  y[lane] = v;
}
