// Valid neighbour of simdgroup_matrix_type.metal for the strict pass (test_metal_strict.py):
// a float matrix; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device float* y [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
  simdgroup_matrix<float, 8, 8> m = make_filled_simdgroup_matrix<float, 8, 8>(1.0f);
  simdgroup_store(m, y, 8);
}
