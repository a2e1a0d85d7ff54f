// Planted defect for the strict pass (test_metal_strict.py): a barrier after
// some threads of the group have returned (MSL, synchronization functions).
#include <metal_stdlib>
using namespace metal;

kernel void planted(
    device float* y [[buffer(0)]],
    constant uint& n [[buffer(1)]],
    uint gid [[thread_position_in_grid]],
    uint t [[thread_index_in_threadgroup]]) {
  threadgroup float tile[64];
  if (gid >= n) {
    return;
  }
  tile[t] = y[gid];
  threadgroup_barrier(mem_flags::mem_threadgroup); // defect
  y[gid] = tile[63 - t];
}
