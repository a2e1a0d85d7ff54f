// Planted defect for the strict pass (test_metal_strict.py): a program-scope
// constexpr without an address space (MSL 4.2: program-scope variables are
// declared in the constant address space).
#include <metal_stdlib>
using namespace metal;

constexpr float kScale = 2.0f; // defect

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] *= kScale;
}
