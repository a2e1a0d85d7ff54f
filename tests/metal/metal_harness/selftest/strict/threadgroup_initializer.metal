// Planted defect for the strict pass (test_metal_strict.py): a threadgroup
// variable with an initializer (MSL 4.4: threadgroup variables cannot be
// initialised where declared).
#include <metal_stdlib>
using namespace metal;

kernel void planted(device int* y [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
  threadgroup int count = 0; // defect
  if (i == 0) {
    count = 1;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[i] = count;
}
