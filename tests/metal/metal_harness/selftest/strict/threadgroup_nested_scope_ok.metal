// Accepted by the strict pass (test_metal_strict.py): a threadgroup array
// declared inside a block of a kernel. OpenCL wants them at a kernel's
// outermost scope; MSL does not (MLX's sort.h declares them per branch).
#include <metal_stdlib>
using namespace metal;

kernel void accepted(device float* y [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
  for (int pass = 0; pass < 2; ++pass) {
    threadgroup float tile[32];
    tile[i] = y[i];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[i] = tile[31 - i];
  }
}
