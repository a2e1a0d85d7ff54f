// Valid neighbour of space_threadgroup_to_device.metal for the strict pass (test_metal_strict.py):
// a helper taking threadgroup memory; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;
void store_all(threadgroup float* dst, int n) {
  for (int k = 0; k < n; ++k) {
    dst[k] = 0.0f;
  }
}
kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  threadgroup float tile[32];
  store_all(tile, 32);
  y[i] = tile[i % 32];
}
