// Planted defect for the strict pass (test_metal_strict.py): a threadgroup
// array at program scope (MSL 4.2 and 4.4: program scope is constant only;
// threadgroup variables belong to a kernel).
#include <metal_stdlib>
using namespace metal;

threadgroup float shared_tile[64]; // defect

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
  shared_tile[i] = y[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[i] = shared_tile[63 - i];
}
