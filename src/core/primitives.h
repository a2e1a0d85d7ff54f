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

#include <memory>
#include <optional>
#include <string>

#include "core/relation.h"
#include "core/route_op.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

namespace mlx_lattice {

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

  // What the autodiff rules read (src/core/autodiff.h).
  const std::string& route() const {
    return route_;
  }
  const std::shared_ptr<Relation>& relation() const {
    return rel_;
  }
  View view() const {
    return view_;
  }
  int groups() const {
    return groups_;
  }
  int bits() const {
    return bits_;
  }
  int group_size() const {
    return group_;
  }
  // K: the relation's kernel volume (1 pointwise).
  int64_t kernel_volume() const {
    return rel_ ? rel_->kernel_volume() : 1;
  }

 protected:
  // Rows of a product over this primitive's view (or x's rows, pointwise).
  int64_t rows(const mx::array& x) const;

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

// GatherConv and WeightGrad: their vjp and jvp run mlx_lattice/autodiff.py's
// rules (src/core/autodiff.h).
class ProductPrimitive : public RoutedPrimitive {
 public:
  ProductPrimitive(
      mx::Stream s,
      Op op,
      std::shared_ptr<Relation> rel,
      View view,
      std::string route,
      int groups,
      WeightFlip flip)
      : RoutedPrimitive(s, op, std::move(rel), view, std::move(route)), flip_(flip) {
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

  WeightFlip flip() const {
    return flip_;
  }

 protected:
  WeightFlip flip_;
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
      WeightFlip flip = {})
      : ProductPrimitive(s, Op::Conv, std::move(rel), view, std::move(route), groups, flip) {}

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
      std::optional<mx::Shape> shape = std::nullopt)
      : ProductPrimitive(s, Op::WeightGrad, std::move(rel), view, std::move(route), groups, {}),
        shape_(std::move(shape)) {}

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) override;
  std::vector<mx::Shape> output_shapes(
      const std::vector<mx::array>& inputs) override;
  bool is_equivalent(const mx::Primitive& other) const override;
  const char* name() const override {
    return "SparseWeightGrad";
  }
  const std::optional<mx::Shape>& shape() const {
    return shape_;
  }

 private:
  // The parameter's shape when the gradient is written in its layout.
  std::optional<mx::Shape> shape_;
};

// Convolution with affine-quantized weights (inference): inputs x, codes
// (B, K, A * bits / 32) uint32, scales and biases (B, K, A / group), then the
// CSR view arrays. Gradients flow to x only (autodiff.py's rules); through
// the weights they raise.
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
// mirrored in place (the CPU routes; the grouped ones mirrored only); over a
// relation marked symmetric a mirrored reading is its other view read in
// order.
mx::array gather_conv(
    const mx::array& x,
    const mx::array& w,
    std::shared_ptr<Relation> rel,
    View view,
    const std::string& route,
    mx::StreamOrDevice s = {},
    int groups = 1,
    WeightFlip flip = {});

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
    std::optional<mx::Shape> shape = std::nullopt);

} // namespace mlx_lattice
