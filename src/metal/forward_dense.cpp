// Routes of metal/forward_dense.metal, on simdgroup matrices: compile-time
// channel counts over a dense neighbour map (forward, and the input gradient
// over the input-major map in 32- and 64-row tiles), and the pointwise
// (1x1x1) GEMM.
#include "metal/route.h"

namespace mlx_lattice::metal {

namespace {

// Output channels per threadgroup of the pointwise GEMM: the smallest
// instantiated block that holds C_out, 64 beyond (several column blocks).
int pointwise_block(int b) {
  return b <= 16 ? 16 : b <= 32 ? 32 : 64;
}

// 64 rows x BN output channels per threadgroup of 4 simdgroups; column
// blocks of a row block are neighbours in the grid, so they share x rows in
// cache.
Program pointwise(const Call& c) {
  ConvParams p = conv_params(c);
  c.require(p.pointwise, "a pointwise product");
  const int bn = pointwise_block(p.b);
  Step s;
  s.kernel = c.stem() + "_" + c.dt + "_n" + std::to_string(bn);
  s.threads = {128, 1, 1};
  s.groups = {ceil_div(p.b, bn), ceil_div(p.rows, 64), 1};
  s.buffers = {input(0, "x"), input(1, "w"), output(), bytes(p)};
  return {{}, {s}};
}

// R rows x C_out per threadgroup of 4 simdgroups (kernels
// <stem>_<dtype>_<C_in>x<C_out>, R fixed by the stem: 32, or 64 for
// dgrad_dense_grouped). The kernel reads a dense neighbour map (rows, K)
// named `map` and the view's row order: a threadgroup's rows are R
// consecutive positions of it.
Program dense_mma(const Call& c, const std::string& stem, int rows_per_group, const char* map) {
  ConvParams p = conv_params(c);
  c.require(
      dense_channels(p.a) && dense_channels(p.b) && !p.pointwise && c.in.size() >= 7,
      "C_in, C_out in {16, 32, 64}, a neighbour map and the row order");
  Step s;
  s.kernel = stem + "_" + c.dt + "_" + std::to_string(p.a) + "x" + std::to_string(p.b);
  s.threads = {128, 1, 1};
  s.groups = {ceil_div(p.rows, rows_per_group), 1, 1};
  s.buffers = {input(0, "x"), input(1, "w"), input(5, map), input(6, "row_order"), output(), bytes(p)};
  return {{}, {s}};
}

// The output-major neighbour map and row order (the forward kernels).
std::vector<mx::array> neighbor_map(Relation& rel, View view) {
  if (view != View::OutputMajor) {
    return {};
  }
  return {rel.neighbor_map(), rel.row_order(view)};
}

// The input-major neighbour map and row order (the input gradient).
std::vector<mx::array> input_neighbor_map(Relation& rel, View view) {
  if (view != View::InputMajor) {
    return {};
  }
  return {rel.input_neighbor_map(), rel.row_order(view)};
}

Program dense_channel(const Call& c) {
  return dense_mma(c, "dense_channel", 32, "neighbor_map");
}

// The forward kernels over the input-major neighbour map (x: the output
// cotangent, w: W transposed per offset).
Program dgrad_dense_channel(const Call& c) {
  return dense_mma(c, "dense_channel", 32, "input_neighbor_map");
}

// As dgrad_dense_channel in 64-row tiles: each W[k] staged serves twice the
// rows (large input capacities).
Program dgrad_dense_grouped(const Call& c) {
  return dense_mma(c, "dgrad_dense_grouped", 64, "input_neighbor_map");
}

} // namespace

const std::vector<Route>& forward_dense_routes() {
  static const std::vector<Route> table = {
      {"metal.pointwise", Op::Conv, nullptr, pointwise},
      {"metal.dense_channel", Op::Conv, neighbor_map, dense_channel},
      {"metal.dgrad_dense_channel", Op::Conv, input_neighbor_map, dgrad_dense_channel},
      {"metal.dgrad_dense_grouped", Op::Conv, input_neighbor_map, dgrad_dense_grouped},
  };
  return table;
}

} // namespace mlx_lattice::metal
