// Planted defect for the strict pass (test_metal_strict.py): a simd_sum after
// some lanes have returned (harness rule, stricter than MSL: every lane of
// the simdgroup reaches a simd-group function).
#include <metal_stdlib>
using namespace metal;

kernel void planted(
    device float* y [[buffer(0)]],
    constant uint& n [[buffer(1)]],
    uint gid [[thread_position_in_grid]]) {
  if (gid >= n) {
    return;
  }
  y[gid] = simd_sum(y[gid]); // defect
}
