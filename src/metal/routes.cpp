// The Metal route tables joined, and what their entries share; the routed
// primitives' eval_gpu.
#include <array>
#include <stdexcept>

#include "core/primitives.h"
#include "metal/route.h"

namespace mlx_lattice::metal {

std::string Call::stem() const {
  return route.substr(route.find('.') + 1);
}

void Call::require(bool ok, const char* what) const {
  if (!ok) {
    throw std::invalid_argument(route + " needs " + what);
  }
}

const std::vector<const Route*>& routes() {
  static const std::vector<const Route*> all = [] {
    std::vector<const Route*> v;
    for (const auto* table :
         {&fetch_on_demand_routes(), &forward_vector_routes(), &forward_dense_routes(),
          &sorted_gemm_routes(), &tensorops_sorted_routes(), &backward_routes(),
          &tensorops_backward_routes(), &quantized_routes(), &tensorops_quantized_routes(),
          &grouped_routes(), &csr_mma_routes(), &wgrad_mma_routes(), &tensorops_wgrad_mma_routes(),
          &tensorops_csr_mma_routes()}) {
      for (const auto& r : *table) {
        v.push_back(&r);
      }
    }
    return v;
  }();
  return all;
}

const Route& find(const std::string& name, Op op) {
  if (const Route* r = find_entry(routes(), name, op)) {
    return *r;
  }
  throw std::invalid_argument("no Metal route named " + name);
}

void register_routes() {
  std::vector<RouteEntry> entries;
  for (const Route* r : routes()) {
    entries.push_back({r->name, r->op, r->extra_inputs, r->grouped});
  }
  mlx_lattice::register_routes(Backend::Metal, "Metal", std::move(entries));
}

Program program(
    const std::string& name,
    Op op,
    const std::vector<mx::array>& inputs,
    const mx::Shape& out_shape,
    mx::Dtype out_dtype,
    int groups) {
  const Route& r = find(name, op);
  return r.program(Call{name, inputs, out_shape, out_dtype, type_name(out_dtype), groups});
}

// ------------------------------------------------------------------ shared

namespace {

// The fields ConvParams and QuantParams have in common; the kernel volume
// and the input holding the gathered rows (its length: the edge count)
// depend on the primitive's input layout.
template <typename P>
P product_params(const Call& c, bool pointwise, int k, size_t gather_input) {
  P p{};
  p.rows = c.out_shape[0];
  p.a = c.in[0].shape(1);
  p.b = c.out_shape[1];
  p.pointwise = pointwise ? 1 : 0;
  p.k = k;
  p.n_in = c.in[0].shape(0);
  p.edges = pointwise ? p.rows : c.in[gather_input].shape(0);
  return p;
}

// (x, second, then the three index buffers at inputs 2..4); a pointwise
// product binds x in their place, never read.
std::vector<Binding> indexed_bindings(
    const char* second,
    const std::array<const char*, 3>& names,
    bool pointwise) {
  std::vector<Binding> b = {input(0, "x"), input(1, second)};
  for (int i = 0; i < 3; ++i) {
    b.push_back(input(pointwise ? 0 : 2 + i, names[i]));
  }
  return b;
}

} // namespace

bool conv_pointwise(const Call& c) {
  return c.in.size() < 5;
}

ConvParams conv_params(const Call& c) {
  return product_params<ConvParams>(c, conv_pointwise(c), c.in[1].shape(0), 3);
}

std::vector<Binding> csr_bindings(bool pointwise) {
  std::vector<Binding> b = indexed_bindings("w", {"offsets", "gather", "k"}, pointwise);
  b.push_back(output());
  return b;
}

bool weight_grad_pointwise(const Call& c) {
  return c.in.size() < 5;
}

WeightGradParams weight_grad_params(const Call& c) {
  return {
      c.out_shape[0], c.out_shape[1], c.out_shape[2],
      weight_grad_pointwise(c) ? static_cast<int32_t>(c.in[0].shape(0)) : -1};
}

std::vector<Binding> pair_bindings(bool pointwise) {
  return indexed_bindings("ct", {"offsets", "g", "r"}, pointwise);
}

GroupedParams grouped_params(int a, int ag, int b, const Call& c) {
  const int groups = c.groups;
  c.require(groups >= 1 && int64_t(ag) * groups == a, "the weight's input channels times the group count");
  c.require(b % groups == 0, "output channels divisible by the group count");
  GroupedParams p{};
  p.a = a;
  p.b = b;
  p.ag = ag;
  p.bg = b / groups;
  return p;
}

Step wgrad_reduce_step(const Call& c, const WeightGradPartsParams& q) {
  Step r;
  r.kernel = "wgrad_reduce_" + c.dt;
  r.threads = {256, 1, 1};
  r.groups = {ceil_div(int64_t(q.a) * q.b, 256), offsets_grid(q.k), 1};
  r.buffers = {temp(0, "partials"), output("dw"), bytes(q)};
  return r;
}

bool quantized_pointwise(const Call& c) {
  return c.in.size() < 7;
}

QuantParams quant_params(const Call& c) {
  QuantParams p =
      product_params<QuantParams>(c, quantized_pointwise(c), c.in[1].shape(1), 5);
  p.bits = static_cast<int32_t>(c.in[1].shape(2) * 32 / std::max(p.a, 1));
  p.group = static_cast<int32_t>(p.a / std::max(c.in[2].shape(2), 1));
  c.require(p.bits == 4 || p.bits == 8, "4- or 8-bit codes");
  c.require(
      c.in[2].dtype() == mx::float32 && c.in[3].dtype() == mx::float32,
      "float32 scales and biases");
  return p;
}

std::vector<mx::array> sorted_plan_inputs(Relation& rel, View view) {
  if (view != View::OutputMajor) {
    return {};
  }
  const auto& p = rel.sorted_plan();
  return {p.reorder_rows, p.out_in_map, p.tile_masks};
}

std::vector<mx::array> input_neighbor_map_inputs(Relation& rel, View view) {
  if (view != View::InputMajor) {
    return {};
  }
  return {rel.input_neighbor_map()};
}

std::vector<mx::array> row_order_inputs(Relation& rel, View view) {
  return {rel.row_order(view)};
}

} // namespace mlx_lattice::metal

namespace mlx_lattice {

// GatherConv, WeightGrad and QuantizedConv on a Metal GPU: the program of
// their route's entry.
void RoutedPrimitive::eval_gpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  auto program = metal::program(route_, op_, in, out[0].shape(), out[0].dtype(), groups_);
  metal::run(program, in, out[0], stream());
}

} // namespace mlx_lattice
