// Routes of metal/fetch_on_demand.metal: the fallback of every float
// product, one thread per output element over the relation's edges.
#include "metal/route.h"

namespace mlx_lattice::metal {

namespace {

// One thread per (row, output channel) over the CSR edges.
Program fetch_on_demand(const Call& c) {
  ConvParams p = conv_params(c);
  Step s;
  s.kernel = c.stem() + "_" + c.dt;
  s.threads = {32, 8, 1};
  s.groups = {ceil_div(p.b, 32), ceil_div(p.rows, 8), 1};
  s.buffers = csr_bindings(p.pointwise);
  s.buffers.push_back(bytes(p));
  return {{}, {s}};
}

// One thread per (offset, input channel, output channel) over the
// kernel-major edges.
Program wgrad_direct(const Call& c) {
  WeightGradParams p = weight_grad_params(c);
  Step s;
  s.kernel = c.stem() + "_" + c.dt;
  s.threads = {32, 8, 1};
  s.groups = {ceil_div(p.b, 32), ceil_div(p.a, 8), offsets_grid(p.k)};
  s.buffers = pair_bindings(weight_grad_pointwise(c));
  s.buffers.push_back(output("dw"));
  s.buffers.push_back(bytes(p));
  return {{}, {s}};
}

} // namespace

const std::vector<Route>& fetch_on_demand_routes() {
  static const std::vector<Route> table = {
      {"metal.fetch_on_demand", Op::Conv, nullptr, fetch_on_demand},
      {"metal.wgrad_direct", Op::WeightGrad, nullptr, wgrad_direct},
  };
  return table;
}

} // namespace mlx_lattice::metal
