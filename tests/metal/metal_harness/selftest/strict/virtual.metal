// Planted defect for the strict pass (test_metal_strict.py): a virtual function
#include <metal_stdlib>
using namespace metal;
struct Op {
  virtual float apply(float v) const { return v; } // defect
};
kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  Op op;
  y[i] = op.apply(y[i]);
}
