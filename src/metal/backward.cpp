// Routes of metal/backward.metal: the weight-gradient kernels without
// TensorOps or simdgroup matrices.
#include "metal/route.h"

namespace mlx_lattice::metal {

namespace {

// A weight-gradient step: (x, ct, offsets, g, r, dw, params).
Program weight_grad_step(const Call& c, std::string kernel, Step s) {
  WeightGradParams p = weight_grad_params(c);
  s.kernel = std::move(kernel);
  s.buffers = pair_bindings(weight_grad_pointwise(c));
  s.buffers.push_back(output("dw"));
  s.buffers.push_back(bytes(p));
  return {{}, {s}};
}

// One group of 256 threads per offset.
Program wgrad_dense_square(const Call& c) {
  WeightGradParams p = weight_grad_params(c);
  c.require(p.a == p.b && dense_channels(p.a), "C_in == C_out in {16, 32, 64}");
  Step s;
  s.threads = {256, 1, 1};
  s.groups = {1, 1, offsets_grid(p.k)};
  return weight_grad_step(c, c.stem() + "_" + c.dt + "_c" + std::to_string(p.a), s);
}

// One thread per (offset, input channel), all 16 output channels.
Program wgrad_cout16(const Call& c) {
  WeightGradParams p = weight_grad_params(c);
  c.require(p.b == 16, "C_out == 16");
  Step s;
  s.threads = {64, 1, 1};
  s.groups = {ceil_div(p.a, 64), 1, offsets_grid(p.k)};
  return weight_grad_step(c, c.stem() + "_" + c.dt, s);
}

// One thread per 4 x 4 block of dW[k] (float32 only).
Program wgrad_block4(const Call& c) {
  WeightGradParams p = weight_grad_params(c);
  c.require(
      c.out_dtype == mx::float32 && p.a % 4 == 0 && p.b % 4 == 0,
      "float32 and C_in, C_out divisible by 4");
  Step s;
  s.threads = {8, 8, 1};
  s.groups = {ceil_div(p.b / 4, 8), ceil_div(p.a / 4, 8), offsets_grid(p.k)};
  return weight_grad_step(c, c.stem(), s);
}

// A 32 x 8 block of dW[k] per group; 32 edges staged at a time (float16
// only).
Program wgrad_fp16(const Call& c) {
  WeightGradParams p = weight_grad_params(c);
  c.require(c.out_dtype == mx::float16, "float16 features");
  Step s;
  s.threads = {32, 8, 1};
  s.groups = {ceil_div(p.b, 32), ceil_div(p.a, 8), offsets_grid(p.k)};
  return weight_grad_step(c, c.stem(), s);
}

} // namespace

const std::vector<Route>& backward_routes() {
  static const std::vector<Route> table = {
      {"metal.wgrad_dense_square", Op::WeightGrad, nullptr, wgrad_dense_square},
      {"metal.wgrad_cout16", Op::WeightGrad, nullptr, wgrad_cout16},
      {"metal.wgrad_block4", Op::WeightGrad, nullptr, wgrad_block4},
      {"metal.wgrad_fp16", Op::WeightGrad, nullptr, wgrad_fp16},
  };
  return table;
}

} // namespace mlx_lattice::metal
