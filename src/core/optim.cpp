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
  return {in[1].shape(), in[1].shape(), in[1].shape()};
}

bool AdamUpdate::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const AdamUpdate&>(other).k_;
  return o.b1 == k_.b1 && o.one_minus_b1 == k_.one_minus_b1 && o.b2 == k_.b2 &&
      o.one_minus_b2 == k_.one_minus_b2 && o.eps == k_.eps &&
      o.bias_correction == k_.bias_correction &&
      o.decoupled_decay == k_.decoupled_decay;
}

std::vector<mx::array> adam_update(
    const mx::array& gradient,
    const mx::array& parameter,
    const mx::array& m,
    const mx::array& v,
    const mx::array& scalars,
    cpu::AdamCoefficients k,
    mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s);
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
  if (scalars.dtype() != mx::float32 || scalars.ndim() != 1 ||
      scalars.shape(0) != 3) {
    throw std::invalid_argument("adam_update: scalars must be float32 of shape (3,)");
  }
  std::vector<mx::array> in = {gradient, parameter, m, v, scalars};
  return mx::array::make_arrays(
      {parameter.shape(), parameter.shape(), parameter.shape()},
      {mx::float32, mx::float32, mx::float32},
      std::make_shared<AdamUpdate>(stream, k),
      in);
}

} // namespace mlx_lattice
