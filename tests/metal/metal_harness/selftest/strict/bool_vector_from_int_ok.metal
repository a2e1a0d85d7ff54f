// Valid neighbour of bool_vector_from_int.metal for the strict pass
// (test_metal_strict.py): comparisons of vectors into bool vectors, !, &&
// and ||, any, all and select. Apple's compiler accepts it, and so must the
// pass.
#include <metal_stdlib>
using namespace metal;
kernel void planted(device float4* y [[buffer(0)]], device int4* z [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  float4 a = y[i];
  float4 c = float4(0.5f);
  bool4 b = a < c;
  bool2 b2 = a.xy == c.zw;
  bool3 b3 = !(a.xyz >= c.xyz);
  int4 iv = z[i];
  bool4 ib = iv != int4(0);
  float4 s = select(a, c, b);
  int4 t = select(iv, int4(1), ib && b);
  bool any_ = any(b) || all(b2) || any(b3) || all(ib);
  float4 m = select(a, c, a > 1.0f);
  y[i] = s + m + float4(any_ ? 1.0f : 0.0f) + float4(b);
  z[i] = t + int4(ib || b);
}
