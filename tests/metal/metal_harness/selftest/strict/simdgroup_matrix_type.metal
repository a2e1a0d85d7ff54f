// Planted defect for the strict pass (test_metal_strict.py): a simdgroup
// matrix of int (MSL, SIMD-group matrix data types:
// half, bfloat or float, 8x8).
#include <metal_stdlib>
using namespace metal;

kernel void planted(device int* y [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
  simdgroup_matrix<int, 8, 8> m; // defect
  simdgroup_store(m, y, 8);
}
