// Valid neighbour of max_threads.metal for the strict pass (test_metal_strict.py):
// 1024 threads; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

[[kernel, max_total_threads_per_threadgroup(1024)]] void planted(
    device float* y [[buffer(0)]],
    uint i [[thread_position_in_grid]]) {
  y[i] = 1.0f;
}
