// Valid neighbour of dynamic_cast.metal for the strict pass (test_metal_strict.py):
// a static_cast; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;
struct Base {
  float v;
};
kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  thread Base b{y[i]};
  thread Base* q = static_cast<thread Base*>(&b);
  y[i] = q->v;
}
