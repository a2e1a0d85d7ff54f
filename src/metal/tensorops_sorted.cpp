// Route of metal/tensorops_sorted.metal: the sorted implicit GEMM on Metal 4
// TensorOps (kernels in mlx_lattice_tensorops.metallib). Its program is
// sorted_gemm's: 64 sorted rows per group, one matmul2d per offset over 4
// simdgroups (the kernel's execution_simdgroups<4>: exactly 128 threads).
#include "metal/route.h"

namespace mlx_lattice::metal {

const std::vector<Route>& tensorops_sorted_routes() {
  static const std::vector<Route> table = {
      {"metal.tensorops_sorted", Op::Conv, sorted_plan_inputs, sorted_gemm_program},
  };
  return table;
}

} // namespace mlx_lattice::metal
