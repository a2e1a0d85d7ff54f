// Routes of metal/tensorops_backward.metal: the input and weight gradients
// on Metal 4 TensorOps (kernels in mlx_lattice_tensorops.metallib; the
// weight gradient's reduction step is wgrad_reduce in backward.metal).
#include <algorithm>

#include "metal/route.h"

namespace mlx_lattice::metal {

namespace {

// 64 input rows per group; one matmul2d per offset over 4 simdgroups.
Program tensorops_dgrad(const Call& c) {
  ConvParams p = conv_params(c);
  c.require(
      c.out_dtype == mx::float32 && p.a == 16 && p.b == 16 && !p.pointwise && c.in.size() >= 6,
      "float32, C_in == C_out == 16 and the input-major neighbour map");
  Step s;
  s.kernel = c.stem() + "_" + c.dt + "_c16";
  s.threads = {128, 1, 1};
  s.groups = {ceil_div(p.rows, 64), 1, 1};
  s.buffers = {input(0, "x"), input(1, "w"), input(5, "input_neighbor_map"), output(), bytes(p)};
  return {{}, {s}};
}

// Step 1: partition (p, k) contracts chunks p, p + P, ... of offset k's
// edges into a float partial; P grows with the edges per offset (about 256
// edges per partition), at most 64. Step 2 adds them in order.
Program tensorops_wgrad(const Call& c) {
  WeightGradParams p = weight_grad_params(c);
  const bool pointwise = weight_grad_pointwise(c);
  c.require(
      dense_channels(p.a) && dense_channels(p.b) && !pointwise,
      "C_in, C_out in {16, 32, 64} and a relation");
  const int64_t edges = c.in[3].shape(0);
  const int64_t per_k = (edges + p.k - 1) / std::max(p.k, 1);
  const int32_t parts = static_cast<int32_t>(std::clamp<int64_t>((per_k + 255) / 256, 1, 64));
  WeightGradPartsParams q{p.k, p.a, p.b, parts};
  Program prog;
  prog.temps.push_back({mx::float32, int64_t(p.k) * parts * p.a * p.b});
  Step s;
  s.kernel = c.stem() + "_" + c.dt + "_" + std::to_string(p.a) + "x" + std::to_string(p.b);
  s.threads = {128, 1, 1};
  s.groups = {static_cast<uint64_t>(parts), offsets_grid(p.k), 1};
  s.buffers = pair_bindings(pointwise);
  s.buffers.push_back(temp(0, "partials"));
  s.buffers.push_back(bytes(q));
  prog.steps.push_back(s);
  prog.steps.push_back(wgrad_reduce_step(c, q));
  return prog;
}

} // namespace

const std::vector<Route>& tensorops_backward_routes() {
  static const std::vector<Route> table = {
      {"metal.tensorops_dgrad", Op::Conv, input_neighbor_map_inputs, tensorops_dgrad},
      {"metal.tensorops_wgrad", Op::WeightGrad, nullptr, tensorops_wgrad},
  };
  return table;
}

} // namespace mlx_lattice::metal
