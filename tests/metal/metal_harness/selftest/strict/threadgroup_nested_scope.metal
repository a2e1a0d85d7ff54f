// Planted defect for the strict pass (test_metal_strict.py): a threadgroup
// array declared inside a block of a kernel, not its outermost scope
// (OpenCL's rule, kept: MSL declares threadgroup variables per kernel).
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
  for (int pass = 0; pass < 2; ++pass) {
    threadgroup float tile[32]; // defect
    tile[i] = y[i];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[i] = tile[31 - i];
  }
}
