// Routes of metal/csr_mma.metal: the matrix-unit implicit GEMM over the CSR
// edges of either view (forward and input gradient alike), any channels;
// and metal.cout16, the seed route for C_out == 16, on the same kernels.
#include "metal/route.h"

namespace mlx_lattice::metal {

namespace {

// Output channels per threadgroup: the smallest instantiated block that
// holds C_out, 128 beyond (wider outputs take several column blocks).
int column_block(int b) {
  for (int bn : {16, 32, 64}) {
    if (b <= bn) {
      return bn;
    }
  }
  return 128;
}

// 32 rows by BN output channels per threadgroup of 4 simdgroups; column
// blocks of a row block are neighbours in the grid, so they share the
// gathered input rows in cache.
Program csr_mma(const Call& c) {
  ConvParams p = conv_params(c);
  const int bn = column_block(p.b);
  Step s;
  s.kernel = "csr_mma_" + c.dt + "_n" + std::to_string(bn);
  s.threads = {128, 1, 1};
  s.groups = {ceil_div(p.b, bn), ceil_div(p.rows, 32), 1};
  s.buffers = csr_bindings(p.pointwise);
  s.buffers.push_back(bytes(p));
  return {{}, {s}};
}

// C_out == 16: the kernels' 16-channel column block, one per 32 rows.
Program cout16(const Call& c) {
  c.require(conv_params(c).b == 16, "C_out == 16");
  return csr_mma(c);
}

} // namespace

const std::vector<Route>& csr_mma_routes() {
  static const std::vector<Route> table = {
      {"metal.csr_mma", Op::Conv, nullptr, csr_mma},
      {"metal.cout16", Op::Conv, nullptr, cout16},
  };
  return table;
}

} // namespace mlx_lattice::metal
