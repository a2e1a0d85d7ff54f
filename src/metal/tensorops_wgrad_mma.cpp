// Routes of metal/tensorops_wgrad_mma.metal: the TensorOps twin of
// metal.wgrad_mma (kernels in mlx_lattice_tensorops.metallib). Its program
// is metal.wgrad_mma's (wgrad_mma.cpp): the same blocks, partitions and
// grid, the same partial buffer and the same ordered wgrad_reduce step
// (backward.metal); only the first step's kernels differ.
#include "metal/route.h"

namespace mlx_lattice::metal {

namespace {

Program tensorops_wgrad_mma(const Call& c) {
  return wgrad_mma_program(c, 1, "tensorops_wgrad_mma");
}

} // namespace

const std::vector<Route>& tensorops_wgrad_mma_routes() {
  static const std::vector<Route> table = {
      {"metal.tensorops_wgrad_mma", Op::WeightGrad, nullptr, tensorops_wgrad_mma},
  };
  return table;
}

} // namespace mlx_lattice::metal
