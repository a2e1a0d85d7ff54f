// The differentiable primitives as their autodiff rules see them, and
// autodiff_rule (src/core/autodiff.h): the call of
// mlx_lattice.autodiff.primitive_rule from a primitive's vjp or jvp.
#include "core/autodiff.h"

#include "bindings/bindings.h"
#include "core/norm.h"
#include "core/primitives.h"

using namespace nanobind::literals;

namespace mlx_lattice {

namespace {

// The primitive under its own bound class (a reference: the rule must not
// keep it past the call).
nb::object bound(mx::Primitive& p) {
  constexpr auto ref = nb::rv_policy::reference;
  if (auto* c = dynamic_cast<GatherConv*>(&p)) {
    return nb::cast(c, ref);
  }
  if (auto* w = dynamic_cast<WeightGrad*>(&p)) {
    return nb::cast(w, ref);
  }
  if (auto* q = dynamic_cast<QuantizedConv*>(&p)) {
    return nb::cast(q, ref);
  }
  if (auto* n = dynamic_cast<NormAct*>(&p)) {
    return nb::cast(n, ref);
  }
  throw std::logic_error(std::string("autodiff_rule: no rule for ") + p.name());
}

} // namespace

std::vector<mx::array> autodiff_rule(const RuleCall& c) {
  nb::gil_scoped_acquire gil;
  // Looked up once; kept for the life of the process (no destructor runs
  // without the GIL).
  static nb::object* rule = new nb::object(
      nb::module_::import_("mlx_lattice.autodiff").attr("primitive_rule"));
  nb::object out = (*rule)(
      c.reverse ? "vjp" : "jvp", bound(c.primitive), c.primals, c.seeds, c.argnums, c.outputs);
  auto result = nb::cast<std::vector<mx::array>>(out);
  const size_t want = c.reverse ? c.argnums.size() : c.primitive.output_shapes(c.primals).size();
  if (result.size() != want) {
    throw std::runtime_error(
        std::string(c.primitive.name()) + ": the autodiff rule returned the wrong count");
  }
  return result;
}

void init_autodiff(nb::module_& m) {
  nb::class_<RoutedPrimitive>(m, "RoutedPrimitive")
      .def_prop_ro("name", [](const RoutedPrimitive& p) { return std::string(p.name()); })
      .def_prop_ro("stream", [](RoutedPrimitive& p) { return p.stream(); })
      .def_prop_ro("route", &RoutedPrimitive::route)
      .def_prop_ro("relation", &RoutedPrimitive::relation)
      .def_prop_ro("view", &RoutedPrimitive::view)
      .def_prop_ro("groups", &RoutedPrimitive::groups)
      .def_prop_ro("bits", &RoutedPrimitive::bits)
      .def_prop_ro("group_size", &RoutedPrimitive::group_size)
      .def_prop_ro("kernel_volume", &RoutedPrimitive::kernel_volume);
  nb::class_<ProductPrimitive, RoutedPrimitive>(m, "ProductPrimitive")
      .def_prop_ro(
          "flip",
          [](const ProductPrimitive& p) {
            return std::make_tuple(p.flip().transposed, p.flip().mirrored);
          });
  nb::class_<GatherConv, ProductPrimitive>(m, "GatherConv");
  nb::class_<WeightGrad, ProductPrimitive>(m, "WeightGrad")
      .def_prop_ro("shape", [](const WeightGrad& p) -> std::optional<std::vector<int>> {
        if (!p.shape()) {
          return std::nullopt;
        }
        return std::vector<int>(p.shape()->begin(), p.shape()->end());
      });
  nb::class_<QuantizedConv, RoutedPrimitive>(m, "QuantizedConv");
  nb::class_<NormAct>(m, "NormAct")
      .def_prop_ro("name", [](const NormAct& p) { return std::string(p.name()); })
      .def_prop_ro("stream", [](NormAct& p) { return p.stream(); })
      .def_prop_ro("segments", [](const NormAct& p) { return p.spec().segments; })
      .def_prop_ro("segmented", [](const NormAct& p) { return p.spec().segmented; })
      .def_prop_ro("training", [](const NormAct& p) { return p.spec().training; })
      .def_prop_ro("residual", [](const NormAct& p) { return p.spec().residual; })
      .def_prop_ro("stats_grad", [](const NormAct& p) { return p.spec().stats_grad; })
      .def_prop_ro("running", [](const NormAct& p) { return p.spec().running; })
      .def_prop_ro("eps", [](const NormAct& p) { return p.spec().eps; })
      .def_prop_ro(
          "low", [](const NormAct& p) { return low_slope(p.spec().act, p.spec().slope); },
          "act'(z) for z <= 0 (1 identity, 0 ReLU, the LeakyReLU slope)")
      .def(
          "backward",
          [](NormAct& p, const std::vector<mx::array>& primals,
             const std::vector<mx::array>& cotangents, const std::vector<mx::array>& outputs) {
            return norm_act_backward(p, primals, cotangents, outputs);
          },
          "primals"_a, "cotangents"_a, "outputs"_a,
          "NormActGrad: [dx, dweight, dbias(, dresidual)].");
}

} // namespace mlx_lattice
