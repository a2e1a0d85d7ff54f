// Accepted by the strict pass (test_metal_strict.py): class objects copied
// out of and assigned into device, constant and threadgroup memory, which
// MSL allows (clang's C++ mode alone would not).
#include <metal_stdlib>
using namespace metal;

struct Affine {
  float4 scale;
  float4 shift;
};

kernel void accepted(
    device float4* y [[buffer(0)]],
    constant Affine& p [[buffer(1)]],
    uint i [[thread_position_in_grid]],
    uint t [[thread_index_in_threadgroup]]) {
  threadgroup float4 tile[32];
  const Affine a = p;
  float4 v = y[i];
  tile[t % 32] = v * a.scale + p.shift;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[i] = tile[t % 32];
}
