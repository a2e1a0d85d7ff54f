// Valid neighbour of swizzle_mixed.metal for the strict pass
// (test_metal_strict.py): swizzles in the xyzw
// and the rgba letters, any order and repeats, on either side of an
// assignment (without repeats there), compound assignment to one. Apple's
// compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;
kernel void planted(device float4* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  float4 a = y[i];
  float4 b = a.wzyx;
  float3 c = a.rgb;
  float2 d = a.xy + b.ba;
  float4 e = float4(a.xy, c.zz);
  a.xy = d;
  a.rg = a.gr;
  b.w = 1.0f;
  a.xyz += c;
  half4 h = half4(a.bgra);
  int4 iv = int4(1, 2, 3, 4);
  int2 p = iv.wx;
  y[i] = a + b + e + float4(h) + float4(float(p.x + p.y)) + float4(a.x, a.y, b.zw);
}
