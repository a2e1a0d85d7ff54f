// Valid neighbour of version_tensor.metal for the strict pass
// (test_metal_strict.py): a header of Metal 3.1 (<metal_tensor> needs 4.0,
// which the tensorops_* files of the build have); Apple's compiler accepts
// it, and so must the pass.
#include <metal_stdlib>
#include <metal_simdgroup_matrix>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = 1.0f;
}
