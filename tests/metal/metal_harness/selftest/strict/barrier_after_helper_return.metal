// Planted defect for the strict pass (test_metal_strict.py): a helper that
// returns early in some threads, then synchronises: those threads go on in
// the kernel (the call is not its last statement) without reaching the
// helper's barrier (MSL, synchronization functions: every thread of the
// threadgroup reaches it).
#include <metal_stdlib>
using namespace metal;

void stage(threadgroup float* tile, device float* y, uint t, uint n) {
  if (t >= n) {
    return;
  }
  tile[t] = y[t];
  threadgroup_barrier(mem_flags::mem_threadgroup); // defect
  y[t] = tile[n - 1 - t];
}

kernel void planted(
    device float* y [[buffer(0)]],
    constant uint& n [[buffer(1)]],
    uint t [[thread_index_in_threadgroup]]) {
  threadgroup float tile[64];
  stage(tile, y, t, n);
  y[t] += 1.0f;
}
