// Planted defect for the strict pass (test_metal_strict.py): dynamic_cast
#include <metal_stdlib>
using namespace metal;
struct Base {
  float v;
};
kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  thread Base b{y[i]};
  thread Base* q = dynamic_cast<thread Base*>(&b); // defect
  y[i] = q->v;
}
