// Accepted by the strict pass (test_metal_strict.py): barriers and simdgroup
// functions under conditions that are the same for every thread that must
// reach them together.
#include <metal_stdlib>
using namespace metal;

struct Params {
  int n;
  int groups;
};

float group_sum(threadgroup float* partial, uint sg, uint lane) {
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const float v = lane < 4 ? partial[lane] : 0.0f; // a per-lane value, not a condition on the call
  return simd_sum(v);
}

kernel void accepted(
    device float* y [[buffer(0)]],
    constant Params& p [[buffer(1)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint t [[thread_index_in_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float partial[4];
  if (int(group.x) >= p.groups) {
    return; // the whole threadgroup leaves
  }
  float acc = 0.0f;
  for (int i = int(t); i < p.n; i += 128) {
    acc += y[i]; // a per-thread trip count, no barrier inside
  }
  for (int step = 0; step < p.n; step += 128) {
    threadgroup_barrier(mem_flags::mem_threadgroup); // a trip count shared by the group
  }
  acc = simd_sum(acc);
  if (sg == 0) {
    acc = simd_max(acc); // simdgroup 0 as a whole
  }
  if (lane == 0) {
    partial[sg] = acc;
  }
  const float total = group_sum(partial, sg, lane);
  if (t == 0) {
    y[group.x] = total;
  }
}
