// Valid neighbour of barrier_shared_divergent.metal for the strict pass
// (test_metal_strict.py): a barrier that orders no
// memory (mem_none), for pacing, under a condition on the thread, in a kernel
// whose threads share no threadgroup memory and meet no other barrier: the
// threads turned away go on to finish, which releases them (MLX's gemv_t:
// the simdgroups past the output's end skip its loop). Apple's compiler
// accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(
    device float* y [[buffer(0)]],
    constant uint& n [[buffer(1)]],
    uint t [[thread_index_in_threadgroup]],
    uint g [[threadgroup_position_in_grid]]) {
  const uint col = g * 64 + t;
  float acc = 0.0f;
  if (col < n) {
    for (uint k = 0; k < 4; ++k) {
      threadgroup_barrier(mem_flags::mem_none);
      acc += y[col] * float(k);
    }
  }
  if (col < n) {
    y[col] = acc;
  }
}
