// The plumbing between layers: fork, cotangent sums and column concatenation.
#include "bindings/bindings.h"
#include "core/feature_ops.h"

using namespace nanobind::literals;

namespace mlx_lattice {

void init_feature_ops(nb::module_& m) {
  m.def(
      "fork",
      [](const mx::array& x, std::optional<mx::Stream> s) {
        return fork(x, stream_or_default(s));
      },
      "x"_a, "stream"_a = nb::none());
  m.def(
      "cotangent_sum",
      [](const mx::array& a, const mx::array& b, std::optional<mx::Stream> s) {
        return cotangent_sum(a, b, stream_or_default(s));
      },
      "a"_a, "b"_a, "stream"_a = nb::none());
  m.def(
      "concat_columns",
      [](const std::vector<mx::array>& xs, std::optional<mx::Stream> s) {
        return concat_columns(xs, stream_or_default(s));
      },
      "arrays"_a, "stream"_a = nb::none());
}

} // namespace mlx_lattice
