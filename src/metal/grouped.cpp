// Routes of metal/grouped.metal: grouped and depthwise products (groups > 1).
// The group count is the primitive's (Call::groups), checked against the
// shapes (grouped_params, routes.cpp): W is (K, A / groups, B) for a
// convolution, the output (K, A / groups, B) for a weight gradient.
#include "metal/route.h"

namespace mlx_lattice::metal {

namespace {

// One thread per (row, output channel) over the CSR edges.
Program grouped_fetch_on_demand(const Call& c) {
  const bool pw = conv_pointwise(c);
  GroupedParams p = grouped_params(c.in[0].shape(1), c.in[1].shape(1), c.out_shape[1], c);
  p.rows = c.out_shape[0];
  p.pointwise_rows = pw ? p.rows : -1;
  Step s;
  s.kernel = c.stem() + "_" + c.dt;
  s.threads = {32, 8, 1};
  s.groups = {ceil_div(p.b, 32), ceil_div(p.rows, 8), 1};
  s.buffers = csr_bindings(pw);
  s.buffers.push_back(bytes(p));
  return {{}, {s}};
}

// One thread per (offset, input channel of a group, output channel) over the
// kernel-major edges.
Program grouped_wgrad(const Call& c) {
  const bool pw = weight_grad_pointwise(c);
  GroupedParams p = grouped_params(c.in[0].shape(1), c.out_shape[1], c.out_shape[2], c);
  p.rows = c.out_shape[0];
  p.pointwise_rows = pw ? static_cast<int>(c.in[0].shape(0)) : -1;
  Step s;
  s.kernel = c.stem() + "_" + c.dt;
  s.threads = {32, 8, 1};
  s.groups = {ceil_div(p.b, 32), ceil_div(p.ag, 8), offsets_grid(p.rows)};
  s.buffers = pair_bindings(pw);
  s.buffers.push_back(output("dw"));
  s.buffers.push_back(bytes(p));
  return {{}, {s}};
}

} // namespace

const std::vector<Route>& grouped_routes() {
  static const std::vector<Route> table = {
      {"metal.grouped_fetch_on_demand", Op::Conv, nullptr, grouped_fetch_on_demand, true},
      {"metal.grouped_wgrad", Op::WeightGrad, nullptr, grouped_wgrad, true},
  };
  return table;
}

} // namespace mlx_lattice::metal
