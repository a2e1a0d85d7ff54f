// Patch attention.
#include "bindings/bindings.h"
#include "core/attention.h"

using namespace nanobind::literals;

namespace mlx_lattice {

void init_attention(nb::module_& m) {
  m.def(
      "patch_attention",
      [](const mx::array& q,
         const mx::array& k,
         const mx::array& v,
         const mx::array& lengths,
         float scale,
         std::optional<mx::Stream> s) {
        return patch_attention(q, k, v, lengths, scale, stream_or_default(s));
      },
      "q"_a, "k"_a, "v"_a, "lengths"_a, "scale"_a, "stream"_a = nb::none());
}

} // namespace mlx_lattice
