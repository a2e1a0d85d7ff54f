// Accepted by the strict pass (test_metal_strict.py): a simd_sum after some
// lanes have returned: it sums over the lanes still active (MSL's SIMD-group
// functions), which the executor checks only when not `strict`.
#include <metal_stdlib>
using namespace metal;

kernel void accepted(
    device float* y [[buffer(0)]],
    constant uint& n [[buffer(1)]],
    uint gid [[thread_position_in_grid]]) {
  if (gid >= n) {
    return;
  }
  y[gid] = simd_sum(y[gid]);
}
