// Routes of metal/forward_vector.metal: per-row kernels over the CSR edges
// of any view (vec4, fp16_gather) and the float32 atomic route.
#include "metal/route.h"

namespace mlx_lattice::metal {

namespace {

// One thread per (row, 4 output channels), float4 arithmetic.
Program vec4(const Call& c) {
  ConvParams p = conv_params(c);
  c.require(p.b % 4 == 0 && c.out_dtype == mx::float32, "float32 and C_out divisible by 4");
  Step s;
  s.kernel = c.stem() + "_" + c.dt;
  s.threads = {32, 8, 1};
  s.groups = {ceil_div(p.b / 4, 32), ceil_div(p.rows, 8), 1};
  s.buffers = csr_bindings(p.pointwise);
  s.buffers.push_back(bytes(p));
  return {{}, {s}};
}

// One simdgroup per row; the row's inputs staged in threadgroup memory.
Program fp16_gather(const Call& c) {
  ConvParams p = conv_params(c);
  c.require(c.out_dtype == mx::float16, "float16 features");
  Step s;
  s.kernel = c.stem() + "_" + c.dt;
  s.threads = {32, 4, 1};
  s.groups = {1, ceil_div(p.rows, 4), 1};
  s.buffers = csr_bindings(p.pointwise);
  s.buffers.push_back(bytes(p));
  return {{}, {s}};
}

std::vector<mx::array> out_idx(Relation& rel, View view) {
  if (view != View::OutputMajor) {
    return {};
  }
  return {rel.out_idx()};
}

// Zero the output, then one thread per (edge, channel) adds atomically.
Program fp32_atomic(const Call& c) {
  ConvParams p = conv_params(c);
  c.require(
      c.out_dtype == mx::float32 && !p.pointwise && c.in.size() >= 6,
      "float32 and the output-major view");
  Program prog;
  Step zero;
  zero.kernel = "fill_zero_float32";
  const int32_t count = p.rows * p.b;
  zero.threads = {256, 1, 1};
  zero.groups = {ceil_div(count, 256), 1, 1};
  zero.buffers = {output(), bytes(count, "count")};
  prog.steps.push_back(zero);
  Step s;
  s.kernel = c.stem() + "_" + c.dt;
  s.threads = {32, 8, 1};
  s.groups = {ceil_div(p.b, 32), ceil_div(p.edges, 8), 1};
  s.buffers = {input(0, "x"), input(1, "w"), input(3, "gather"), input(4, "k"),
               input(5, "out_idx"), output(), bytes(p)};
  prog.steps.push_back(s);
  return prog;
}

} // namespace

const std::vector<Route>& forward_vector_routes() {
  static const std::vector<Route> table = {
      {"metal.vec4", Op::Conv, nullptr, vec4},
      {"metal.fp16_gather", Op::Conv, nullptr, fp16_gather},
      {"metal.fp32_atomic", Op::Conv, out_idx, fp32_atomic},
  };
  return table;
}

} // namespace mlx_lattice::metal
