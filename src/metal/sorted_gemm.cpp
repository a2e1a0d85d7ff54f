// Route of metal/sorted_gemm.metal: the direct sorted implicit GEMM.
#include "metal/route.h"

namespace mlx_lattice::metal {

// 64 sorted rows per group, 4 simdgroups of 8x8 matrix tiles.
Program sorted_gemm_program(const Call& c) {
  ConvParams p = conv_params(c);
  c.require(
      c.out_dtype == mx::float16 && p.a == p.b && (p.a == 32 || p.a == 64) && p.k == 27 &&
          c.in.size() >= 8,
      "float16, K == 27, C_in == C_out in {32, 64} and the sorted plan");
  p.n_tiles = c.in[7].shape(0);
  Step s;
  s.kernel = c.stem() + "_" + c.dt + "_c" + std::to_string(p.b);
  s.threads = {128, 1, 1};
  s.groups = {ceil_div(p.rows, 64), 1, 1};
  s.buffers = {input(0, "x"), input(1, "w"), input(5, "reorder_rows"),
               input(6, "sorted_out_in_map"), input(7, "tile_masks"), output(), bytes(p)};
  return {{}, {s}};
}

const std::vector<Route>& sorted_gemm_routes() {
  static const std::vector<Route> table = {
      {"metal.sorted_gemm", Op::Conv, sorted_plan_inputs, sorted_gemm_program},
  };
  return table;
}

} // namespace mlx_lattice::metal
