// Valid for the strict pass (test_metal_strict.py): MSL's matrix types
// (float4x4, half3x3, float2x3, ...) from columns, scalars and other
// matrices, their columns and elements, matrix * vector, vector * matrix,
// matrix * matrix, transpose and determinant. Apple's compiler accepts it,
// and so must the pass.
#include <metal_stdlib>
using namespace metal;
kernel void planted(device float4* y [[buffer(0)]], device const float4x4* m [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  float4x4 a = m[0];
  float4x4 t = transpose(a);
  float d = determinant(a);
  float4 v = a * y[i];
  float4 w = y[i] * t;
  float4x4 c(float4(1, 0, 0, 0), float4(0, 1, 0, 0), float4(0, 0, 1, 0), float4(0, 0, 0, 1));
  float4x4 s = a * c + t;
  half3x3 h = half3x3(half3(1), half3(2), half3(3));
  half3 hv = h * half3(1.0h);
  float3x3 f3 = float3x3(h);
  float2x2 r(1.0f);
  float2x3 mm;
  mm[0] = float3(1);
  float x = s[1][2] + f3[0].y + r[1][1] + determinant(float3x3(1.0f)) + mm[0][1];
  y[i] = v + w + float4(d + x) + float4(float3(hv), 1.0f) + s[2];
}
