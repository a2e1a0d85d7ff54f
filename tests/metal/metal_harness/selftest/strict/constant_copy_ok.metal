// Accepted by the strict pass (test_metal_strict.py): objects copied out of
// constant memory, which MSL allows and OpenCL's kernel language does not
// (its copies take `generic` references, which exclude `constant`).
#include <metal_stdlib>
using namespace metal;

struct Params {
  int n;
  float scale;
  float4 bias;
};

float scaled(Params q, float v) {
  return v * q.scale + q.bias.x;
}

constant Params kDefaults = {1, 1.0f, float4(0.0f)};

kernel void accepted(
    device float* y [[buffer(0)]],
    constant Params& p [[buffer(1)]],
    constant Params* table [[buffer(2)]],
    uint i [[thread_position_in_grid]]) {
  Params q = p;
  Params r = kDefaults;
  r = table[i % 4];
  const metal::array<float, 2> pair = {p.scale, q.scale};
  y[i] = scaled(p, y[i]) + scaled(r, pair[0]) + pair[1];
}
