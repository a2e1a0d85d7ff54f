// Valid neighbour of vector_cast_width.metal for the strict pass
// (test_metal_strict.py): casts between vector
// types (static_cast<float4>(int4), constructors) and between vector and
// scalar pointers of one address space. Apple's compiler accepts it, and so
// must the pass.
#include <metal_stdlib>
using namespace metal;
kernel void planted(device float4* y [[buffer(0)]], device int4* z [[buffer(1)]], threadgroup float4* tg [[threadgroup(0)]],
              uint i [[thread_position_in_grid]], uint l [[thread_index_in_threadgroup]]) {
  device float* p = (device float*)y;
  device float4* q = (device float4*)p;
  device const half* hp = reinterpret_cast<device const half*>(z);
  float4 f = static_cast<float4>(z[i]);
  int4 iv = int4(y[i]);
  uint4 u = static_cast<uint4>(iv);
  half4 h = half4(f);
  float2 f2 = float2(h.xy);
  threadgroup float* tp = (threadgroup float*)tg;
  tp[l] = p[i];
  thread float4 loc = f;
  thread float* lp = (thread float*)&loc;
  q[i] = f + float4(u) + float4(h) + float4(f2, lp[1], float(hp[0])) + float4(tp[0]);
}
