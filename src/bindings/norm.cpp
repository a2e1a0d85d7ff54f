// Fused normalisation + activation and a batch norm's running statistics.
#include "bindings/bindings.h"
#include "core/norm.h"

using namespace nanobind::literals;

namespace mlx_lattice {

void init_norm(nb::module_& m) {
  m.def(
      "norm_act",
      [](const mx::array& x, const mx::array& weight, const mx::array& bias,
         std::optional<mx::array> residual, std::optional<mx::array> segments,
         int n_segments, std::optional<mx::array> mean,
         std::optional<mx::array> var, float eps, int act, float slope,
         std::optional<mx::Stream> s, bool stats_grad) {
        return norm_act(
            x, weight, bias, residual, segments, n_segments, mean, var, eps,
            act, slope, stream_or_default(s), stats_grad);
      },
      "x"_a, "weight"_a, "bias"_a, "residual"_a.none(), "segments"_a.none(),
      "n_segments"_a, "mean"_a.none(), "var"_a.none(), "eps"_a, "act"_a,
      "slope"_a, "stream"_a = nb::none(), "stats_grad"_a = true);
  m.def(
      "norm_act_running",
      [](const mx::array& x, const mx::array& weight, const mx::array& bias,
         std::optional<mx::array> residual, float eps, int act, float slope,
         const mx::array& running_mean, const mx::array& running_var, float keep, float mu,
         float ratio, std::optional<mx::Stream> s) {
        return norm_act_running(
            x, weight, bias, residual, eps, act, slope, running_mean, running_var, keep, mu,
            ratio, stream_or_default(s));
      },
      "x"_a, "weight"_a, "bias"_a, "residual"_a.none(), "eps"_a, "act"_a, "slope"_a,
      "running_mean"_a, "running_var"_a, "keep"_a, "mu"_a, "ratio"_a,
      "stream"_a = nb::none());
  m.def(
      "running_stats",
      [](const mx::array& mean, const mx::array& var, const mx::array& batch_mean,
         const mx::array& batch_var, float keep, float mu, float ratio,
         std::optional<mx::Stream> s) {
        return running_stats(
            mean, var, batch_mean, batch_var, keep, mu, ratio, stream_or_default(s));
      },
      "mean"_a, "var"_a, "batch_mean"_a, "batch_var"_a, "keep"_a, "mu"_a, "ratio"_a,
      "stream"_a = nb::none());
}

} // namespace mlx_lattice
