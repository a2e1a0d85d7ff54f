// Accepted by the strict pass (test_metal_strict.py): names that are
// keywords in OpenCL's kernel language and not in MSL (`half` is a type MSL
// code may shadow), beside the type half itself.
#include <metal_stdlib>
using namespace metal;

float global_scale(float local) {
  return 2.0f * local;
}

kernel void accepted(device half* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  const half h = y[i];
  const uint global = i;
  {
    const int half = 3;
    y[global] = h + ::half(global_scale(float(half)));
  }
}
