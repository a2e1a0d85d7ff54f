// Planted defect for the strict pass (test_metal_strict.py): a threadgroup
// size limit above what Apple GPUs run (1024 threads per threadgroup).
#include <metal_stdlib>
using namespace metal;

[[kernel, max_total_threads_per_threadgroup(2048)]] void planted( // defect
    device float* y [[buffer(0)]],
    uint i [[thread_position_in_grid]]) {
  y[i] = 1.0f;
}
