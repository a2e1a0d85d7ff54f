// Routes of metal/csr_mma.metal: the matrix-unit implicit GEMM over the CSR
// edges of either view (forward and input gradient alike), any channels;
// metal.csr_mma for ungrouped products, metal.grouped_csr_mma for grouped
// ones (the same kernels, a threadgroup per group's column block), and
// metal.cout16, the seed route for C_out == 16, on the same kernels.
#include "metal/route.h"

namespace mlx_lattice::metal {

namespace {

// Output channels per threadgroup: the smallest instantiated block that
// holds a group's outputs, 128 beyond (wider groups take several column
// blocks).
int column_block(int b) {
  for (int bn : {16, 32, 64}) {
    if (b <= bn) {
      return bn;
    }
  }
  return 128;
}

// 32 rows (consecutive positions of the view's row order) by BN output
// channels of one group per threadgroup of 4 simdgroups; the (group, column
// block) pairs of a row block are neighbours in the grid, so they share the
// gathered input rows in cache. The kernels: <stem>_<dtype>_n<BN>.
Program csr_mma_program(const Call& c, GroupedParams p, int groups, const std::string& stem) {
  const bool pw = conv_pointwise(c);
  p.rows = c.out_shape[0];
  p.pointwise_rows = pw ? p.rows : -1;
  const int bn = column_block(p.bg);
  Step s;
  s.kernel = stem + "_" + c.dt + "_n" + std::to_string(bn);
  s.threads = {128, 1, 1};
  s.groups = {uint64_t(groups) * ceil_div(p.bg, bn), ceil_div(p.rows, 32), 1};
  c.require(pw || c.in.size() >= 6, "the view's row order");
  s.buffers = csr_bindings(pw);
  // the rows in order (x in its place for a pointwise product, never read)
  s.buffers.insert(s.buffers.end() - 1, input(pw ? 0 : 5, "row_order"));
  s.buffers.push_back(bytes(p));
  return {{}, {s}};
}

Program csr_mma(const Call& c) {
  return csr_mma_program(c, "csr_mma");
}

// W is (K, A / groups, B) for the primitive's group count.
Program grouped_csr_mma(const Call& c) {
  const GroupedParams p =
      grouped_params(c.in[0].shape(1), c.in[1].shape(1), c.out_shape[1], c);
  return csr_mma_program(c, p, p.a / p.ag, "csr_mma");
}

// C_out == 16: the kernels' 16-channel column block, one per 32 rows (one
// group).
Program cout16(const Call& c) {
  c.require(c.out_shape[1] == 16, "C_out == 16");
  return csr_mma(c);
}

} // namespace

// One group: ag = a, bg = b.
Program csr_mma_program(const Call& c, const std::string& stem) {
  GroupedParams p{};
  p.a = p.ag = c.in[0].shape(1);
  p.b = p.bg = c.out_shape[1];
  return csr_mma_program(c, p, 1, stem);
}

const std::vector<Route>& csr_mma_routes() {
  static const std::vector<Route> table = {
      {"metal.csr_mma", Op::Conv, row_order_inputs, csr_mma},
      {"metal.grouped_csr_mma", Op::Conv, row_order_inputs, grouped_csr_mma, true},
      {"metal.cout16", Op::Conv, row_order_inputs, cout16},
  };
  return table;
}

} // namespace mlx_lattice::metal
