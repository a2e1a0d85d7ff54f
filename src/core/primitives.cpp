// The routed primitives apart from their evaluation: input checks, the
// arrays each route reads, and the hand-over of their vjp and jvp to
// mlx_lattice/autodiff.py's rules (src/core/autodiff.h).
// eval_cpu runs the route's entry in src/cpu/routes.cpp, eval_gpu in
// src/metal/routes.cpp; here a route is known by its registered table
// (core/route_table.h).
#include "core/primitives.h"

#include <stdexcept>

#include "core/autodiff.h"
#include "core/route_table.h"
#include "mlx/ops.h"

namespace mlx_lattice {

namespace {

int64_t view_rows(const Relation& rel, View v) {
  return v == View::OutputMajor ? rel.n_out() : rel.n_in();
}

// Index arrays (offsets, gather, k) of a CSR view.
std::vector<mx::array> view_arrays(Relation& rel, View v) {
  if (v == View::OutputMajor) {
    return {rel.out_offsets(), rel.in_idx(), rel.k_idx()};
  }
  const auto& im = rel.input_major();
  return {im.offsets, im.out_idx, im.k_idx};
}

// Kernel-major (offsets, gather row, result row) pairs for a view.
std::vector<mx::array> pair_arrays(Relation& rel, View v) {
  const auto& km = rel.kernel_major();
  if (v == View::OutputMajor) {
    return {km.offsets, km.in_idx, km.out_idx};
  }
  return {km.offsets, km.out_idx, km.in_idx};
}

// Whether `route`'s kernels take a grouped product (its table entry says).
bool is_grouped(const std::string& route, Op op) {
  return find_route(route, op).entry.grouped;
}

void check_groups(int64_t a, int64_t b, int groups, const std::string& route, Op route_op, const char* op) {
  if (groups < 1 || a % groups != 0 || b % groups != 0) {
    throw std::invalid_argument(
        std::string(op) + ": groups must be >= 1 and divide both channel counts");
  }
  if (groups > 1 && !is_grouped(route, route_op)) {
    throw std::invalid_argument(
        std::string(op) + ": a grouped product needs a grouped route, not " + route);
  }
}

// Whether `route` (an entry of a registered table for `op`, else this
// raises) is a Metal program's: those bind dense arrays and read neither a
// flipped weight nor the parameter layout.
bool runs_on_metal(const std::string& route, Op op) {
  return find_route(route, op).backend == Backend::Metal;
}

// Appends a relation view's index arrays, and the route's extra arrays, to a
// primitive's inputs after checking that x has the view's gathered rows.
void append_view_inputs(
    std::vector<mx::array>& inputs,
    const mx::array& x,
    const std::shared_ptr<Relation>& rel,
    View view,
    const std::string& route,
    Op prim,
    const char* op) {
  if (x.shape(0) != view_rows(*rel, flip(view))) {
    throw std::invalid_argument(std::string(op) + ": x rows do not match relation");
  }
  for (auto& a : view_arrays(*rel, view)) {
    inputs.push_back(a);
  }
  if (auto extra = find_route(route, prim).entry.extra_inputs) {
    for (auto& a : extra(*rel, view)) {
      inputs.push_back(a);
    }
  }
}

} // namespace

KernelDims kernel_dims(const mx::Shape& w) {
  if (w.size() == 3) {
    return {w[0], w[1], w[2]};
  }
  int64_t k = 1;
  for (size_t i = 1; i + 1 < w.size(); ++i) {
    k *= w[i];
  }
  return {k, w.back(), w[0]};
}

std::vector<mx::array> conv_inputs(
    const mx::array& x,
    const mx::array& w,
    const std::shared_ptr<Relation>& rel,
    View view,
    const std::string& route,
    mx::StreamOrDevice s,
    int groups,
    WeightFlip flip) {
  if (w.ndim() < 2 || groups < 1) {
    throw std::invalid_argument(
        "gather_conv: expected w (K, A / groups, B), or the parameter (B, k1, ..., A / groups)");
  }
  const KernelDims d = kernel_dims(w.shape());
  // Channels x brings and the product makes, with the flip applied.
  const int64_t a_in = flip.transposed ? d.b : d.a * groups;
  const int64_t b_out = flip.transposed ? d.a * groups : d.b;
  if (x.ndim() != 2 || x.shape(1) != a_in) {
    throw std::invalid_argument(
        flip.transposed ? "gather_conv: expected x (N, B) for a weight read transposed"
                        : "gather_conv: expected x (N, A), w (K, A / groups, B)");
  }
  check_groups(a_in, b_out, groups, route, Op::Conv, "gather_conv");
  if (x.dtype() != w.dtype()) {
    throw std::invalid_argument("gather_conv: x and w dtypes differ");
  }
  if (!rel && d.k != 1) {
    throw std::invalid_argument("gather_conv: pointwise needs K == 1");
  }
  if (rel && d.k != rel->kernel_volume()) {
    throw std::invalid_argument("gather_conv: w has the wrong kernel volume");
  }
  const bool metal = runs_on_metal(route, Op::Conv);
  if (metal && flip.any()) {
    throw std::invalid_argument(
        "gather_conv: route " + route + " reads no flipped weight; pass the flipped copy");
  }
  if (is_grouped(route, Op::Conv) && flip.transposed) {
    throw std::invalid_argument(
        "gather_conv: route " + route + " reads no transposed weight; pass the transposed copy");
  }
  if (metal && parameter_layout(w)) {
    throw std::invalid_argument(
        "gather_conv: route " + route + " reads a kernel-major (K, A, B) weight");
  }
  auto stream = mx::to_stream(s);
  // The CPU routes take x and w as they come: the gather-GEMM packs its
  // weight panels through w's strides (the parameter, and its transposed or
  // mirrored reading, in place), and eval_cpu copies only what a kernel
  // cannot read so (src/cpu/routes.cpp), with no Contiguous node per call.
  // The Metal programs bind dense arrays.
  std::vector<mx::array> inputs = {x, w};
  if (metal) {
    inputs = {mx::contiguous(x, false, stream), mx::contiguous(w, false, stream)};
  }
  if (rel) {
    append_view_inputs(inputs, x, rel, view, route, Op::Conv, "gather_conv");
  }
  return inputs;
}

mx::array gather_conv(
    const mx::array& x,
    const mx::array& w,
    std::shared_ptr<Relation> rel,
    View view,
    const std::string& route,
    mx::StreamOrDevice s,
    int groups,
    WeightFlip flip) {
  auto stream = mx::to_stream(s);
  // A symmetric relation's view read with the weight mirrored is its other
  // view read with the weight in order: the same edges, (q <- p, k) being
  // (p <- q, K - 1 - k). A relation built symmetric makes that view from its
  // own CSR without a sort (relation.cpp), and the product then sums each
  // output's edges in the weight's order, as over any other view.
  if (rel && rel->symmetric() && flip.mirrored) {
    view = mlx_lattice::flip(view);
    flip.mirrored = false;
  }
  auto inputs = conv_inputs(x, w, rel, view, route, stream, groups, flip);
  auto prim = std::make_shared<GatherConv>(stream, rel, view, route, groups, flip);
  auto shape = prim->output_shapes(inputs)[0];
  return mx::array(std::move(shape), x.dtype(), std::move(prim), std::move(inputs));
}

std::vector<mx::array> weight_grad_inputs(
    const mx::array& x,
    const mx::array& ct,
    const std::shared_ptr<Relation>& rel,
    View view,
    mx::StreamOrDevice s,
    const std::string& route) {
  auto stream = mx::to_stream(s);
  auto c = mx::astype(ct, x.dtype(), stream);
  // As conv_inputs: dense arrays for the Metal programs (and for a caller
  // naming no route), the operands as they come for a CPU route.
  std::vector<mx::array> inputs = {x, c};
  if (route.empty() || runs_on_metal(route, Op::WeightGrad)) {
    inputs = {mx::contiguous(x, false, stream), mx::contiguous(c, false, stream)};
  }
  if (rel) {
    for (auto& a : pair_arrays(*rel, view)) {
      inputs.push_back(a);
    }
  }
  return inputs;
}

mx::array weight_grad(
    const mx::array& x,
    const mx::array& ct,
    std::shared_ptr<Relation> rel,
    View view,
    int64_t k,
    const std::string& route,
    mx::StreamOrDevice s,
    int groups,
    std::optional<mx::Shape> shape) {
  const bool metal = runs_on_metal(route, Op::WeightGrad);
  check_groups(x.shape(1), ct.shape(1), groups, route, Op::WeightGrad, "weight_grad");
  if (shape) {
    const auto d = shape->size() >= 2 ? kernel_dims(*shape) : KernelDims{};
    if (shape->size() < 2 || shape->size() == 3 || d.k != k || d.b != ct.shape(1) ||
        d.a * groups != x.shape(1)) {
      throw std::invalid_argument(
          "weight_grad: shape must be a parameter's (B, k1, ..., A / groups) with "
          "k1 * ... = k, B = ct.shape[1] and A = x.shape[1]");
    }
    if (metal) {
      throw std::invalid_argument(
          "weight_grad: route " + route + " writes a kernel-major (K, A, B) gradient");
    }
  }
  auto stream = mx::to_stream(s);
  mx::Shape out = shape ? *shape
                        : mx::Shape{static_cast<int>(k), x.shape(1) / groups, ct.shape(1)};
  return mx::array(
      std::move(out),
      x.dtype(),
      std::make_shared<WeightGrad>(stream, rel, view, route, groups, shape),
      weight_grad_inputs(x, ct, rel, view, stream, route));
}

// ----------------------------------------------------------- RoutedPrimitive

bool RoutedPrimitive::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const RoutedPrimitive&>(other);
  return op_ == o.op_ && rel_ == o.rel_ && view_ == o.view_ && route_ == o.route_ &&
      bits_ == o.bits_ && group_ == o.group_ && groups_ == o.groups_;
}

int64_t RoutedPrimitive::rows(const mx::array& x) const {
  return rel_ ? view_rows(*rel_, view_) : x.shape(0);
}

// ---------------------------------------------------------------- GatherConv

std::vector<mx::Shape> GatherConv::output_shapes(
    const std::vector<mx::array>& in) {
  const KernelDims d = kernel_dims(in[1].shape());
  const int64_t b = flip_.transposed ? d.a * groups_ : d.b;
  return {{static_cast<int>(rows(in[0])), static_cast<int>(b)}};
}

// ---------------------------------------------------------------- WeightGrad

std::vector<mx::Shape> WeightGrad::output_shapes(
    const std::vector<mx::array>& in) {
  if (shape_) {
    return {*shape_};
  }
  int64_t k = rel_ ? rel_->kernel_volume() : 1;
  return {{static_cast<int>(k), in[0].shape(1) / groups_, in[1].shape(1)}};
}

bool WeightGrad::is_equivalent(const mx::Primitive& other) const {
  return ProductPrimitive::is_equivalent(other) &&
      static_cast<const WeightGrad&>(other).shape_ == shape_;
}

// ---------------------------------------------------------- ProductPrimitive

bool ProductPrimitive::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const ProductPrimitive&>(other);
  return RoutedPrimitive::is_equivalent(other) && flip_ == o.flip_;
}

// Only the two operands take derivatives: the view's index arrays are
// integers (a transform asking for them gets zeros).
std::vector<mx::array> ProductPrimitive::vjp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>& argnums,
    const std::vector<mx::array>&) {
  std::vector<int> operands;
  for (int arg : argnums) {
    if (arg < 2) {
      operands.push_back(arg);
    }
  }
  std::vector<mx::array> grads;
  if (!operands.empty()) {
    grads = autodiff_rule({true, *this, primals, {cotangents[0]}, operands, {}});
  }
  std::vector<mx::array> out;
  size_t next = 0;
  for (int arg : argnums) {
    out.push_back(arg < 2 ? grads[next++] : mx::zeros_like(primals[arg], stream()));
  }
  return out;
}

std::vector<mx::array> ProductPrimitive::jvp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& tangents,
    const std::vector<int>& argnums) {
  std::vector<int> operands;
  std::vector<mx::array> seeds;
  for (size_t i = 0; i < argnums.size(); ++i) {
    if (argnums[i] < 2) {
      operands.push_back(argnums[i]);
      seeds.push_back(tangents[i]);
    }
  }
  if (operands.empty()) {
    return {mx::zeros(output_shapes(primals)[0], primals[0].dtype(), stream())};
  }
  return autodiff_rule({false, *this, primals, seeds, operands, {}});
}

} // namespace mlx_lattice

namespace mlx_lattice {

// ------------------------------------------------------------- QuantizedConv

std::vector<mx::array> quantized_conv_inputs(
    const mx::array& x,
    const mx::array& codes,
    const mx::array& scales,
    const mx::array& biases,
    int bits,
    int group,
    const std::shared_ptr<Relation>& rel,
    View view,
    const std::string& route,
    mx::StreamOrDevice s) {
  find_route(route, Op::QuantizedConv);
  auto stream = mx::to_stream(s);
  if (codes.ndim() != 3 || scales.ndim() != 3 || biases.shape() != scales.shape()) {
    throw std::invalid_argument(
        "quantized_conv: expected codes (B, K, A*bits/32), scales and biases (B, K, A/group)");
  }
  const int64_t k = codes.shape(1);
  const int64_t a = x.shape(1);
  if (codes.shape(2) * (32 / bits) != a || scales.shape(2) * group != a) {
    throw std::invalid_argument("quantized_conv: weight channels do not match x");
  }
  if (rel && k != rel->kernel_volume()) {
    throw std::invalid_argument("quantized_conv: wrong kernel volume");
  }
  // Scales and biases travel as float32 (exact for every float dtype), so
  // the kernels have one scale type.
  std::vector<mx::array> inputs = {
      mx::contiguous(x, false, stream),
      mx::contiguous(codes, false, stream),
      mx::contiguous(mx::astype(scales, mx::float32, stream), false, stream),
      mx::contiguous(mx::astype(biases, mx::float32, stream), false, stream)};
  if (rel) {
    append_view_inputs(inputs, x, rel, view, route, Op::QuantizedConv, "quantized_conv");
  }
  return inputs;
}

mx::array quantized_conv(
    const mx::array& x,
    const mx::array& codes,
    const mx::array& scales,
    const mx::array& biases,
    int bits,
    int group,
    std::shared_ptr<Relation> rel,
    View view,
    const std::string& route,
    mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s);
  auto inputs = quantized_conv_inputs(
      x, codes, scales, biases, bits, group, rel, view, route, stream);
  const int64_t rows = rel ? view_rows(*rel, view) : x.shape(0);
  return mx::array(
      {static_cast<int>(rows), codes.shape(0)},
      x.dtype(),
      std::make_shared<QuantizedConv>(stream, rel, view, route, bits, group),
      std::move(inputs));
}

std::vector<mx::Shape> QuantizedConv::output_shapes(
    const std::vector<mx::array>& in) {
  return {{static_cast<int>(rows(in[0])), in[1].shape(0)}};
}

// Gradients of x only (the codes, scales and biases raise): the rules ask
// for x's alone where they may, and the view arrays take zeros.
std::vector<mx::array> QuantizedConv::vjp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>& argnums,
    const std::vector<mx::array>& outputs) {
  return autodiff_rule({true, *this, primals, {cotangents[0]}, argnums, outputs});
}

std::vector<mx::array> QuantizedConv::jvp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& tangents,
    const std::vector<int>& argnums) {
  return autodiff_rule({false, *this, primals, tangents, argnums, {}});
}

} // namespace mlx_lattice
