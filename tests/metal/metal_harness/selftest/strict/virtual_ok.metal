// Valid neighbour of virtual.metal for the strict pass (test_metal_strict.py):
// a plain member function; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;
struct Op {
  float apply(float v) const { return v; }
};
kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  Op op;
  y[i] = op.apply(y[i]);
}
