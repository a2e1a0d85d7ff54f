// Route of metal/tensorops_quantized.metal: the sorted quantized contraction
// on Metal 4 TensorOps (kernels in mlx_lattice_tensorops.metallib).
#include "metal/route.h"

namespace mlx_lattice::metal {

namespace {

// The grid and bindings of metal.sorted_quantized (quantized.cpp); one scale
// and bias per (output channel, offset).
Program tensorops_quantized(const Call& c) {
  return sorted_quantized_program(c, true);
}

} // namespace

const std::vector<Route>& tensorops_quantized_routes() {
  static const std::vector<Route> table = {
      {"metal.tensorops_quantized", Op::QuantizedConv, sorted_plan_inputs, tensorops_quantized},
  };
  return table;
}

} // namespace mlx_lattice::metal
