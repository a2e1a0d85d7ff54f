// MLX primitives of the sparse convolution.
//
// GatherConv computes, for every row r of a CSR view of a relation,
//     y[r] = sum_{e in row r} x[gather[e]] @ W[k[e]]        W: (K, A, B)
// With the output-major view this is the convolution; with the input-major
// view (and W transposed per offset) it is the input gradient. Without a
// relation it is the pointwise product y = x @ W[0].
//
// WeightGrad computes dW[k] = sum_{edges with offset k} x[g]^T ct[r].
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/relation.h"
#include "core/route_op.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

namespace mlx_lattice {

// What a derived product of QuantizedConv asks the route registry.
struct RouteQuery {
  std::string direction; // "forward", "dgrad" or "wgrad"
  std::string kind;      // relation kind, or "pointwise"
  int64_t k, c_in, c_out, n_in, n_out, edges;
  std::string dtype;
  bool gpu;
  std::string from_route; // the route of the primitive being differentiated
  int64_t groups = 1;     // channel groups of a grouped product
};
using RouteHook = std::function<std::string(const RouteQuery&)>;

// The Python registry answers the route query of QuantizedConv's input
// gradient (mlx_lattice.autodiff installs the hook on import); without a
// hook the product keeps the quantized route's name, which must serve it.
void set_route_hook(RouteHook hook);

[[noreturn]] void not_differentiable(const char* primitive, const char* instead);

// What the three primitives share: the relation and view they run over, the
// route that runs them (a key of the CPU table in src/cpu/routes.cpp and of
// the Metal tables in src/metal/<family>.cpp), and the dispatch to it.
class RoutedPrimitive : public mx::Primitive {
 public:
  RoutedPrimitive(
      mx::Stream s,
      Op op,
      std::shared_ptr<Relation> rel,
      View view,
      std::string route)
      : mx::Primitive(s),
        op_(op),
        rel_(std::move(rel)),
        view_(view),
        route_(std::move(route)) {}

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out)
      override;
  void eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out)
      override;
  bool is_equivalent(const mx::Primitive& other) const override;

  const std::string& route() const {
    return route_;
  }

 protected:
  // Rows of a product over this primitive's view (or x's rows, pointwise).
  int64_t rows(const mx::array& x) const;
  // The sum of term(i) over the tangents; zeros of `shape` when none.
  mx::array sum_terms(
      const std::vector<int>& argnums,
      const std::function<std::optional<mx::array>(size_t)>& term,
      const mx::Shape& shape,
      mx::Dtype dtype);

  Op op_;
  std::shared_ptr<Relation> rel_;
  View view_;
  std::string route_;
  int bits_ = 0; // quantized weights only
  int group_ = 0;
  int groups_ = 1; // grouped products: W is (K, A / groups_, B)
};

// How a conv product reads its weight: W[k] is block k of the weight read
// kernel-major, transposed (W[k]^T, an input gradient's) and / or mirrored
// (block K - 1 - k, an input gradient over a symmetric relation).
struct WeightFlip {
  bool transposed = false;
  bool mirrored = false;
  bool any() const {
    return transposed || mirrored;
  }
  bool operator==(const WeightFlip& o) const {
    return transposed == o.transposed && mirrored == o.mirrored;
  }
};

// One transform of a GatherConv or WeightGrad, handed to the autodiff rules.
struct ProductRuleCall {
  bool reverse; // vjp (seeds: the output's cotangent) or jvp (seeds: tangents)
  Op op;
  const std::string& route;
  const std::shared_ptr<Relation>& rel;
  View view;
  int groups;
  WeightFlip flip;
  bool symmetric; // the relation's edges (q, p, k) and (p, q, K - 1 - k) pair up
  std::vector<mx::array> operands; // x and w (conv), x and ct (weight_grad)
  std::vector<mx::array> seeds;    // one per operand in argnums (jvp), or the cotangent
  std::vector<int> argnums;        // operands (0, 1) the transform asks for
  mx::Shape out_shape;             // the product's output shape
};
// Returns, for a vjp, one gradient per argnum; for a jvp, the output's tangent.
using ProductRuleHook = std::function<std::vector<mx::array>(const ProductRuleCall&)>;

// The autodiff rules of GatherConv and WeightGrad are mlx_lattice/autodiff.py's,
// written once for every backend; that module installs this hook on import,
// through which the primitives' own vjp and jvp reach them (so a product is
// one graph node, without a custom function around it).
void set_product_rule_hook(ProductRuleHook hook);

// GatherConv and WeightGrad: their vjp and jvp run the rules through the
// hook above; without one installed they raise naming the function to call
// (`rule`).
class ProductPrimitive : public RoutedPrimitive {
 public:
  ProductPrimitive(
      mx::Stream s,
      Op op,
      std::shared_ptr<Relation> rel,
      View view,
      std::string route,
      int groups,
      WeightFlip flip,
      bool symmetric,
      const char* rule)
      : RoutedPrimitive(s, op, std::move(rel), view, std::move(route)),
        flip_(flip),
        symmetric_(symmetric),
        rule_(rule) {
    groups_ = groups;
  }

  std::vector<mx::array> jvp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& tangents,
      const std::vector<int>& argnums) override;
  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>& outputs) override;
  bool is_equivalent(const mx::Primitive& other) const override;

 protected:
  WeightFlip flip_;
  bool symmetric_;

 private:
  std::vector<mx::array> run_rule(
      bool reverse,
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& seeds,
      const std::vector<int>& argnums);

  const char* rule_;
};

// The weight of a product comes kernel-major, (K, A / groups, B) of any
// strides, or as the parameter itself, (B, k1, ..., A / groups) with
// K = k1 * ...: the (C_out, Kx, Ky, Kz, C_in / groups) weight of a
// convolution or the (C_out, C_in) one of a linear layer, which the CPU
// routes read in place. Only a 3D weight is kernel-major.
inline bool parameter_layout(const mx::array& w) {
  return w.ndim() != 3;
}

// (K, A / groups, B) of a product's weight of this shape (either layout),
// before any flip.
struct KernelDims {
  int64_t k = 0, a = 0, b = 0;
};
KernelDims kernel_dims(const mx::Shape& w);

class GatherConv : public ProductPrimitive {
 public:
  GatherConv(
      mx::Stream s,
      std::shared_ptr<Relation> rel,
      View view,
      std::string route,
      int groups = 1,
      WeightFlip flip = {},
      bool symmetric = false)
      : ProductPrimitive(
            s, Op::Conv, std::move(rel), view, std::move(route), groups, flip, symmetric,
            "autodiff.conv") {}

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) override;
  std::vector<mx::Shape> output_shapes(
      const std::vector<mx::array>& inputs) override;
  const char* name() const override {
    return "SparseGatherConv";
  }
};

class WeightGrad : public ProductPrimitive {
 public:
  WeightGrad(
      mx::Stream s,
      std::shared_ptr<Relation> rel,
      View view,
      std::string route,
      int groups = 1,
      bool symmetric = false,
      std::optional<mx::Shape> shape = std::nullopt)
      : ProductPrimitive(
            s, Op::WeightGrad, std::move(rel), view, std::move(route), groups, {}, symmetric,
            "autodiff.weight_grad"),
        shape_(std::move(shape)) {}

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) override;
  std::vector<mx::Shape> output_shapes(
      const std::vector<mx::array>& inputs) override;
  bool is_equivalent(const mx::Primitive& other) const override;
  const char* name() const override {
    return "SparseWeightGrad";
  }

 private:
  // The parameter's shape when the gradient is written in its layout.
  std::optional<mx::Shape> shape_;
};

// Convolution with affine-quantized weights (inference): inputs x, codes
// (B, K, A * bits / 32) uint32, scales and biases (B, K, A / group), then the
// CSR view arrays. Gradients flow to x only; through the weights they raise.
class QuantizedConv : public RoutedPrimitive {
 public:
  QuantizedConv(
      mx::Stream s,
      std::shared_ptr<Relation> rel,
      View view,
      std::string route,
      int bits,
      int group)
      : RoutedPrimitive(s, Op::QuantizedConv, std::move(rel), view, std::move(route)) {
    bits_ = bits;
    group_ = group;
  }

  std::vector<mx::array> jvp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& tangents,
      const std::vector<int>& argnums) override;
  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>& outputs) override;
  std::vector<mx::Shape> output_shapes(
      const std::vector<mx::array>& inputs) override;
  const char* name() const override {
    return "SparseQuantizedConv";
  }

 private:
  // The float weight (K, A, B) the codes stand for.
  mx::array mapped_weight(const std::vector<mx::array>& primals);
};

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
    mx::StreamOrDevice s = {});

// QuantizedConv's inputs: x, codes, scales and biases (as float32), the
// view arrays and the route's extra inputs.
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
    mx::StreamOrDevice s = {});

// The primitives' inputs, exactly as the ops build them (also used by the
// Metal test harness to run a route's program on the same arrays).
std::vector<mx::array> conv_inputs(
    const mx::array& x,
    const mx::array& w,
    const std::shared_ptr<Relation>& rel,
    View view,
    const std::string& route,
    mx::StreamOrDevice s = {},
    int groups = 1,
    WeightFlip flip = {});
std::vector<mx::array> weight_grad_inputs(
    const mx::array& x,
    const mx::array& ct,
    const std::shared_ptr<Relation>& rel,
    View view,
    mx::StreamOrDevice s = {},
    const std::string& route = "");

// x: (N, A), w: (K, A, B) -> (rows, B). rel == nullptr: pointwise (K == 1).
// groups > 1: w is (K, A / groups, B), each group of B / groups outputs
// reading its A / groups inputs (a grouped route). w may also be the
// parameter (see parameter_layout), and `flip` reads it transposed and / or
// mirrored in place (the CPU routes that are not grouped); `symmetric`
// marks a relation whose input gradient may read the same view mirrored.
mx::array gather_conv(
    const mx::array& x,
    const mx::array& w,
    std::shared_ptr<Relation> rel,
    View view,
    const std::string& route,
    mx::StreamOrDevice s = {},
    int groups = 1,
    WeightFlip flip = {},
    bool symmetric = false);

// x: (N_gather, A), ct: (rows, B) -> (K, A / groups, B), or with `shape`
// (B, k1, ..., A / groups) the gradient in that parameter's layout (CPU
// routes).
mx::array weight_grad(
    const mx::array& x,
    const mx::array& ct,
    std::shared_ptr<Relation> rel,
    View view,
    int64_t k,
    const std::string& route,
    mx::StreamOrDevice s = {},
    int groups = 1,
    bool symmetric = false,
    std::optional<mx::Shape> shape = std::nullopt);

} // namespace mlx_lattice
