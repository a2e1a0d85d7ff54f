// Accepted by the strict pass (test_metal_strict.py): a barrier after some
// threads of the group have returned from the kernel. They have finished,
// and Apple GPUs release finished threads from threadgroup barriers (MLX's
// column reductions return early and then synchronise the rest).
#include <metal_stdlib>
using namespace metal;

kernel void accepted(
    device float* y [[buffer(0)]],
    constant uint& n [[buffer(1)]],
    uint gid [[thread_position_in_grid]],
    uint t [[thread_index_in_threadgroup]]) {
  threadgroup float tile[64];
  if (gid >= n) {
    return;
  }
  tile[t] = y[gid];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[gid] = tile[t];
}
