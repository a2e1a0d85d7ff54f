// Routes of metal/quantized.metal: int4/int8 codes read in place over any
// CSR view, and the sorted quantized implicit GEMM.
#include "metal/route.h"

namespace mlx_lattice::metal {

namespace {

// One thread per (row, output channel); codes read in place.
Program quantized_fetch_on_demand(const Call& c) {
  QuantParams p = quant_params(c);
  Step s;
  s.kernel = c.stem() + "_" + c.dt + "_int" + std::to_string(p.bits);
  s.threads = {32, 8, 1};
  s.groups = {ceil_div(p.b, 32), ceil_div(p.rows, 8), 1};
  s.buffers = {input(0, "x"), input(1, "codes"), input(2, "scales"), input(3, "biases")};
  const char* names[3] = {"offsets", "gather", "k"};
  for (int i = 0; i < 3; ++i) {
    s.buffers.push_back(input(p.pointwise ? 0 : 4 + i, names[i]));
  }
  s.buffers.push_back(output());
  s.buffers.push_back(bytes(p));
  return {{}, {s}};
}

} // namespace

// 64 sorted rows per group of 128 threads (4 simdgroups); shared with
// metal.tensorops_quantized, whose weights carry one group per row.
Program sorted_quantized_program(const Call& c, bool one_group) {
  QuantParams p = quant_params(c);
  auto c3264 = [](int ch) { return ch == 32 || ch == 64; };
  c.require(
      c.out_dtype == mx::float16 && c3264(p.a) && c3264(p.b) && p.k == 27 && c.in.size() >= 10 &&
          (one_group ? p.group == p.a : p.group <= p.a),
      one_group
          ? "float16, K == 27, C_in, C_out in {32, 64}, group_size == C_in and the sorted plan"
          : "float16, K == 27, C_in, C_out in {32, 64}, group_size <= C_in and the sorted plan");
  p.n_tiles = c.in[9].shape(0);
  Step s;
  s.kernel = c.stem() + "_" + c.dt + "_" + std::to_string(p.a) + "x" + std::to_string(p.b) +
      "_int" + std::to_string(p.bits);
  s.threads = {128, 1, 1};
  s.groups = {ceil_div(p.rows, 64), 1, 1};
  s.buffers = {input(0, "x"), input(1, "codes"), input(2, "scales"), input(3, "biases"),
               input(7, "reorder_rows"), input(8, "sorted_out_in_map"), input(9, "tile_masks"),
               output(), bytes(p)};
  return {{}, {s}};
}

namespace {

Program sorted_quantized(const Call& c) {
  return sorted_quantized_program(c, false);
}

} // namespace

const std::vector<Route>& quantized_routes() {
  static const std::vector<Route> table = {
      {"metal.quantized_fetch_on_demand", Op::QuantizedConv, nullptr, quantized_fetch_on_demand},
      {"metal.sorted_quantized", Op::QuantizedConv, sorted_plan_inputs, sorted_quantized},
  };
  return table;
}

} // namespace mlx_lattice::metal
