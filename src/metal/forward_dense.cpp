// Routes of metal/forward_dense.metal: compile-time channel counts with the
// offset's weights staged in threadgroup memory (forward, and the input
// gradient over the input-major map), and the pointwise (1x1x1) GEMM.
#include "metal/route.h"

namespace mlx_lattice::metal {

namespace {

// 16 x 16 output tiles; x and w staged through threadgroup memory.
Program pointwise(const Call& c) {
  ConvParams p = conv_params(c);
  c.require(p.pointwise, "a pointwise product");
  Step s;
  s.kernel = c.stem() + "_" + c.dt;
  s.threads = {16, 16, 1};
  s.groups = {ceil_div(p.b, 16), ceil_div(p.rows, 16), 1};
  s.buffers = {input(0, "x"), input(1, "w"), output(), bytes(p)};
  return {{}, {s}};
}

// (C_out / 4) x R threads; W[k] staged in threadgroup memory per offset.
// The kernel reads a dense neighbour map (rows, K) named `map`.
Program dense_channel_over(const Call& c, const char* map) {
  ConvParams p = conv_params(c);
  c.require(
      dense_channels(p.a) && dense_channels(p.b) && !p.pointwise && c.in.size() >= 6,
      "C_in, C_out in {16, 32, 64} and a neighbour map");
  Step s;
  s.kernel = "dense_channel_" + c.dt + "_" + std::to_string(p.a) + "x" + std::to_string(p.b);
  const uint64_t tx = p.b / 4;
  const uint64_t ty = 256 / tx;
  s.threads = {tx, ty, 1};
  s.groups = {1, ceil_div(p.rows, ty), 1};
  s.buffers = {input(0, "x"), input(1, "w"), input(5, map), output(), bytes(p)};
  return {{}, {s}};
}

std::vector<mx::array> neighbor_map(Relation& rel, View view) {
  if (view != View::OutputMajor) {
    return {};
  }
  return {rel.neighbor_map()};
}

Program dense_channel(const Call& c) {
  return dense_channel_over(c, "neighbor_map");
}

// The forward kernels over the input-major neighbour map (x: the output
// cotangent, w: W transposed per offset).
Program dgrad_dense_channel(const Call& c) {
  return dense_channel_over(c, "input_neighbor_map");
}

} // namespace

const std::vector<Route>& forward_dense_routes() {
  static const std::vector<Route> table = {
      {"metal.pointwise", Op::Conv, nullptr, pointwise},
      {"metal.dense_channel", Op::Conv, neighbor_map, dense_channel},
      {"metal.dgrad_dense_channel", Op::Conv, input_neighbor_map_inputs, dgrad_dense_channel},
  };
  return table;
}

} // namespace mlx_lattice::metal
