// Planted defect for the strict pass (test_metal_strict.py): a threadgroup
// array declared in a helper function (MSL 4.4: threadgroup variables are
// declared in a kernel function).
#include <metal_stdlib>
using namespace metal;

float reverse_in_group(float v, uint i) {
  threadgroup float tile[32]; // defect
  tile[i] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return tile[31 - i];
}

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
  y[i] = reverse_in_group(y[i], i);
}
