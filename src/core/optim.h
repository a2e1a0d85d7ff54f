// The fused Adam / AdamW parameter update (CPU primitive): one pass over a
// float32 parameter, its gradient and both moments, with the results of
// mlx.optimizers.Adam / AdamW bit for bit (src/cpu/adam.cpp).
#pragma once

#include <vector>

#include "core/primitive_decl.h"
#include "core/adam.h"
#include "mlx/array.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

namespace mlx_lattice {

namespace mx = mlx::core;

// Inputs: gradient, parameter, m, v (same shape, float32) for each of
// `count` parameters in turn, then scalars (3,) float32: the learning rate
// (lr / (1 - b1^t) with bias correction), 1 / sqrt(1 - b2^t) and
// 1 - lr * weight_decay. Outputs: the new parameter, m and v of each
// parameter in turn. One primitive updates every parameter of a step (each
// through the same kernel, so the bits do not depend on the grouping).
class AdamUpdate : public mx::Primitive {
 public:
  AdamUpdate(mx::Stream s, AdamCoefficients k, int count = 1)
      : mx::Primitive(s), k_(k), count_(count) {}

  LATTICE_EVAL()
  LATTICE_OUTPUT_SHAPES()
  LATTICE_NAME("AdamUpdate")
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  AdamCoefficients k_;
  int count_;
};

// Builds the update's graph; returns {parameter, m, v}.
std::vector<mx::array> adam_update(
    const mx::array& gradient,
    const mx::array& parameter,
    const mx::array& m,
    const mx::array& v,
    const mx::array& scalars,
    AdamCoefficients k,
    mx::StreamOrDevice s = {});

// The update of several parameters (gradients[i], parameters[i], m[i],
// v[i] each of one shape, float32) by one primitive; returns {parameter,
// m, v} of each in turn.
std::vector<mx::array> adam_update_group(
    const std::vector<mx::array>& gradients,
    const std::vector<mx::array>& parameters,
    const std::vector<mx::array>& m,
    const std::vector<mx::array>& v,
    const mx::array& scalars,
    AdamCoefficients k,
    mx::StreamOrDevice s = {});

} // namespace mlx_lattice
