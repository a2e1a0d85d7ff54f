// Valid neighbour of constant_write.metal for the strict pass (test_metal_strict.py):
// a write to device memory only; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

struct Params {
  int n;
  float scale;
};

kernel void planted(
    device float* y [[buffer(0)]],
    constant Params& p [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  y[i] *= p.scale;
  y[i] += p.scale;
}
