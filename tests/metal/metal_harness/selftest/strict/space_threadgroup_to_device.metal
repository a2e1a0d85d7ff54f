// Planted defect for the strict pass (test_metal_strict.py): a threadgroup array passed where a device pointer is required
#include <metal_stdlib>
using namespace metal;
void store_all(device float* dst, int n) {
  for (int k = 0; k < n; ++k) {
    dst[k] = 0.0f;
  }
}
kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  threadgroup float tile[32];
  store_all(tile, 32); // defect
  y[i] = tile[i % 32];
}
