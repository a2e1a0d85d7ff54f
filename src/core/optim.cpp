// The fused Adam / AdamW update: the primitive apart from its evaluation
// (the op's checks). eval_cpu is in src/cpu/optim.cpp, over the kernel
// compiled per instruction-set path in src/cpu/adam.cpp.
#include "core/optim.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "mlx/ops.h"

namespace mlx_lattice {

std::vector<mx::Shape> AdamUpdate::output_shapes(
    const std::vector<mx::array>& in) {
  std::vector<mx::Shape> out;
  for (int i = 0; i < count_; ++i) {
    const auto& shape = in[4 * i + 1].shape();
    out.insert(out.end(), {shape, shape, shape});
  }
  return out;
}

bool AdamUpdate::is_equivalent(const mx::Primitive& other) const {
  auto& a = static_cast<const AdamUpdate&>(other);
  auto& o = a.k_;
  return a.count_ == count_ && o.b1 == k_.b1 && o.one_minus_b1 == k_.one_minus_b1 &&
      o.b2 == k_.b2 && o.one_minus_b2 == k_.one_minus_b2 && o.eps == k_.eps &&
      o.bias_correction == k_.bias_correction &&
      o.decoupled_decay == k_.decoupled_decay;
}

namespace {

void check_parameter(
    const mx::array& gradient, const mx::array& parameter, const mx::array& m,
    const mx::array& v) {
  const std::pair<const char*, const mx::array*> arrays[] = {
      {"gradient", &gradient}, {"parameter", &parameter}, {"m", &m}, {"v", &v}};
  for (auto [what, a] : arrays) {
    if (a->dtype() != mx::float32) {
      throw std::invalid_argument(
          std::string("adam_update: ") + what + " must be float32");
    }
    if (a->shape() != parameter.shape()) {
      throw std::invalid_argument(
          std::string("adam_update: ") + what +
          " must have the parameter's shape");
    }
  }
}

void check_scalars(const mx::array& scalars) {
  if (scalars.dtype() != mx::float32 || scalars.ndim() != 1 ||
      scalars.shape(0) != 3) {
    throw std::invalid_argument("adam_update: scalars must be float32 of shape (3,)");
  }
}

} // namespace

std::vector<mx::array> adam_update_group(
    const std::vector<mx::array>& gradients,
    const std::vector<mx::array>& parameters,
    const std::vector<mx::array>& m,
    const std::vector<mx::array>& v,
    const mx::array& scalars,
    AdamCoefficients k,
    mx::StreamOrDevice s) {
  const size_t n = parameters.size();
  if (gradients.size() != n || m.size() != n || v.size() != n) {
    throw std::invalid_argument(
        "adam_update_group: gradients, parameters, m and v must have one entry per parameter");
  }
  if (n == 0) {
    return {};
  }
  std::vector<mx::array> in;
  std::vector<mx::Shape> shapes;
  for (size_t i = 0; i < n; ++i) {
    check_parameter(gradients[i], parameters[i], m[i], v[i]);
    in.insert(in.end(), {gradients[i], parameters[i], m[i], v[i]});
    shapes.insert(shapes.end(), 3, parameters[i].shape());
  }
  check_scalars(scalars);
  in.push_back(scalars);
  return mx::array::make_arrays(
      std::move(shapes), std::vector<mx::Dtype>(3 * n, mx::float32),
      std::make_shared<AdamUpdate>(mx::to_stream(s), k, static_cast<int>(n)), in);
}

std::vector<mx::array> adam_update(
    const mx::array& gradient,
    const mx::array& parameter,
    const mx::array& m,
    const mx::array& v,
    const mx::array& scalars,
    AdamCoefficients k,
    mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s);
  check_parameter(gradient, parameter, m, v);
  check_scalars(scalars);
  std::vector<mx::array> in = {gradient, parameter, m, v, scalars};
  return mx::array::make_arrays(
      {parameter.shape(), parameter.shape(), parameter.shape()},
      {mx::float32, mx::float32, mx::float32},
      std::make_shared<AdamUpdate>(stream, k),
      in);
}

} // namespace mlx_lattice
