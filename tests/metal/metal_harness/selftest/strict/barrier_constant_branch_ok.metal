// Valid for the strict pass (test_metal_strict.py): a barrier under a
// condition on the thread, in a branch that the template's instantiation
// decides at compile time never to run (MLX's gemv: `if
// (needs_tgp_reduction)` with BM = 1); Apple's compiler accepts it, and so
// must the pass.
#include <metal_stdlib>
using namespace metal;

template <int BM>
struct Reducer {
  static constant constexpr const bool needs_reduction = BM > 1;
  static void run(threadgroup float* tile, device float* y, uint t) {
    tile[t] = y[t];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (needs_reduction) {
      if (t < 32) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
        y[t] += tile[t + 32];
      }
    }
    y[t] += tile[63 - t];
  }
};

kernel void planted(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
  threadgroup float tile[64];
  Reducer<1>::run(tile, y, t);
}
