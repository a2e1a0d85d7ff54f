// Routes of metal/tensorops_csr_mma.metal: the TensorOps twin of
// metal.csr_mma (kernels in mlx_lattice_tensorops.metallib). Its program is
// metal.csr_mma's (csr_mma.cpp): the same column blocks, grid, row order
// and bindings, forward and input gradient alike; only the kernels differ.
#include "metal/route.h"

namespace mlx_lattice::metal {

namespace {

Program tensorops_csr_mma(const Call& c) {
  return csr_mma_program(c, "tensorops_csr_mma");
}

} // namespace

const std::vector<Route>& tensorops_csr_mma_routes() {
  static const std::vector<Route> table = {
      {"metal.tensorops_csr_mma", Op::Conv, row_order_inputs, tensorops_csr_mma},
  };
  return table;
}

} // namespace mlx_lattice::metal
