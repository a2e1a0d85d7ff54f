// The fused Adam / AdamW update.
#include "bindings/bindings.h"
#include "core/optim.h"

using namespace nanobind::literals;

namespace mlx_lattice {

void init_optim(nb::module_& m) {
  m.def(
      "adam_update",
      [](const mx::array& g, const mx::array& p, const mx::array& m,
         const mx::array& v, const mx::array& scalars, float b1,
         float one_minus_b1, float b2, float one_minus_b2, float eps,
         bool bias_correction, bool decoupled_decay,
         std::optional<mx::Stream> s) {
        AdamCoefficients k{b1, one_minus_b1, b2, one_minus_b2, eps,
                                bias_correction, decoupled_decay};
        return adam_update(g, p, m, v, scalars, k, stream_or_default(s));
      },
      "gradient"_a, "parameter"_a, "m"_a, "v"_a, "scalars"_a, "b1"_a,
      "one_minus_b1"_a, "b2"_a, "one_minus_b2"_a, "eps"_a,
      "bias_correction"_a, "decoupled_decay"_a, "stream"_a = nb::none());
  m.def(
      "adam_update_group",
      [](const std::vector<mx::array>& g, const std::vector<mx::array>& p,
         const std::vector<mx::array>& m, const std::vector<mx::array>& v,
         const mx::array& scalars, float b1, float one_minus_b1, float b2,
         float one_minus_b2, float eps, bool bias_correction, bool decoupled_decay,
         std::optional<mx::Stream> s) {
        AdamCoefficients k{b1, one_minus_b1, b2, one_minus_b2, eps,
                                bias_correction, decoupled_decay};
        return adam_update_group(g, p, m, v, scalars, k, stream_or_default(s));
      },
      "gradients"_a, "parameters"_a, "m"_a, "v"_a, "scalars"_a, "b1"_a,
      "one_minus_b1"_a, "b2"_a, "one_minus_b2"_a, "eps"_a,
      "bias_correction"_a, "decoupled_decay"_a, "stream"_a = nb::none(),
      "Every parameter's fused update by one primitive: [parameter, m, v] of "
      "each in turn.");
}

} // namespace mlx_lattice
