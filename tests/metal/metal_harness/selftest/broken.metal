// Harness self-test kernels with planted bugs; each must be caught. The
// executor must see them, so the strict pass lets this file build only if
// it finds exactly these (test_metal_strict.py checks where):
// strict-pass: expect threadgroup-memory, uniform-control
#include <metal_stdlib>
using namespace metal;

kernel void oob_write(
    device const float* x [[buffer(0)]],
    device float* y [[buffer(1)]],
    uint gid [[thread_position_in_grid]]) {
  const float v = x[gid % 16];
  y[gid] = v;  // PLANTED: no guard against the padded grid
}

kernel void oob_read(
    device const float* x [[buffer(0)]],
    device float* y [[buffer(1)]],
    uint gid [[thread_position_in_grid]]) {
  y[gid] = x[gid + 1];  // PLANTED: reads one past the end
}

kernel void negative_write(
    device float* y [[buffer(0)]],
    uint gid [[thread_position_in_grid]]) {
  y[int(gid) - 1] = 1.0f;  // PLANTED: y[-1]
}

kernel void tg_array_overflow(
    device float* y [[buffer(0)]],
    uint tid [[thread_index_in_threadgroup]]) {
  threadgroup float tile[32];
  tile[tid] = 1.0f;  // PLANTED: 64 threads, 32 slots
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[tid] = tile[tid % 32];
}

// Each thread reads its neighbour's slot; `with_barrier` selects the
// correct version.
kernel void neighbour_sum(
    device const float* x [[buffer(0)]],
    device float* y [[buffer(1)]],
    constant int& with_barrier [[buffer(2)]],
    uint gid [[thread_position_in_grid]],
    uint tid [[thread_index_in_threadgroup]],
    uint tpg [[threads_per_threadgroup]]) {
  threadgroup float tile[256];
  tile[tid] = x[gid];
  if (with_barrier) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  y[gid] = tile[tid] + tile[(tid + 1) % tpg];  // PLANTED when with_barrier == 0
}

kernel void unwritten_tg_read(
    device const float* x [[buffer(0)]],
    device float* y [[buffer(1)]],
    uint gid [[thread_position_in_grid]],
    uint tid [[thread_index_in_threadgroup]]) {
  threadgroup float tile[64];
  if (tid < 32) {
    tile[tid] = x[gid];  // PLANTED: half the tile is never written
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[gid] = tile[63 - tid];
}

kernel void divergent_simd_sum(
    device const float* x [[buffer(0)]],
    device float* y [[buffer(1)]],
    uint gid [[thread_position_in_grid]],
    uint lane [[thread_index_in_simdgroup]]) {
  float v = x[gid];
  if (lane < 16) {
    v = simd_sum(v);  // PLANTED: half the simdgroup calls it
  }
  y[gid] = v;
}

kernel void divergent_barrier(
    device float* y [[buffer(0)]],
    uint tid [[thread_index_in_threadgroup]]) {
  if (tid < 32) {
    threadgroup_barrier(mem_flags::mem_threadgroup);  // PLANTED
    y[tid] = 1.0f;
  } else {
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[tid] = 2.0f;
  }
}

kernel void early_return_barrier(
    device float* y [[buffer(0)]],
    constant uint& n [[buffer(1)]],
    uint gid [[thread_position_in_grid]],
    uint tid [[thread_index_in_threadgroup]]) {
  threadgroup float tile[64];
  if (gid >= n) {
    return;  // not a defect: Apple GPUs release finished threads from barriers
  }
  tile[tid] = float(gid);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[gid] = tile[tid];
}

kernel void early_return_simd(
    device float* y [[buffer(0)]],
    constant uint& n [[buffer(1)]],
    uint gid [[thread_position_in_grid]]) {
  if (gid >= n) {
    return;  // PLANTED: lanes leave before the rest of their simdgroup's simd_sum
  }
  y[gid] = simd_sum(1.0f);
}

kernel void tg_memory_too_big(
    device float* y [[buffer(0)]],
    uint tid [[thread_index_in_threadgroup]]) {
  threadgroup float big[9000];  // PLANTED: 36000 bytes > 32 KiB
  big[tid] = 1.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[tid] = big[tid];
}

kernel void spin_forever(
    device atomic_uint* flag [[buffer(0)]],
    uint gid [[thread_position_in_grid]]) {
  // PLANTED: waits for another threadgroup, which never runs concurrently.
  if (gid == 0) {
    while (atomic_load_explicit(flag, memory_order_relaxed) == 0u) {
    }
  } else {
    atomic_store_explicit(flag, 1u, memory_order_relaxed);
  }
}
