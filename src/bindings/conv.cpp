// The convolution primitives: the products, their inputs as the primitives
// take them and the route tables.
#include "bindings/bindings.h"
#include "core/primitives.h"
#include "core/route_table.h"
#include "cpu/routes.h"
#include "metal/route.h"

using namespace nanobind::literals;

namespace mlx_lattice {

void init_conv(nb::module_& m) {
  // The native backends' tables, which the primitives look routes up in.
  cpu::register_routes();
  metal::register_routes();
  m.def(
      "gather_conv",
      [](const mx::array& x,
         const mx::array& w,
         std::shared_ptr<Relation> rel,
         View view,
         const std::string& route,
         std::optional<mx::Stream> s,
         int groups,
         std::tuple<bool, bool> flip) {
        return gather_conv(
            x, w, rel, view, route, stream_or_default(s), groups,
            {std::get<0>(flip), std::get<1>(flip)});
      },
      "x"_a, "w"_a, "relation"_a.none(), "view"_a, "route"_a,
      "stream"_a = nb::none(), "groups"_a = 1,
      "flip"_a = std::make_tuple(false, false));
  m.def(
      "weight_grad",
      [](const mx::array& x,
         const mx::array& ct,
         std::shared_ptr<Relation> rel,
         View view,
         int64_t k,
         const std::string& route,
         std::optional<mx::Stream> s,
         int groups,
         std::optional<std::vector<int>> shape) {
        std::optional<mx::Shape> out;
        if (shape) {
          out = mx::Shape(shape->begin(), shape->end());
        }
        return weight_grad(
            x, ct, rel, view, k, route,
            stream_or_default(s), groups, out);
      },
      "x"_a, "ct"_a, "relation"_a.none(), "view"_a, "k"_a, "route"_a,
      "stream"_a = nb::none(), "groups"_a = 1, "shape"_a = nb::none());
  m.def(
      "quantized_conv",
      [](const mx::array& x,
         const mx::array& codes,
         const mx::array& scales,
         const mx::array& biases,
         int bits,
         int group,
         std::shared_ptr<Relation> rel,
         View view,
         const std::string& route,
         std::optional<mx::Stream> s) {
        return quantized_conv(
            x, codes, scales, biases, bits, group, rel,
            view, route, stream_or_default(s));
      },
      "x"_a, "codes"_a, "scales"_a, "biases"_a, "bits"_a, "group_size"_a,
      "relation"_a.none(), "view"_a, "route"_a, "stream"_a = nb::none());
  m.def(
      "native_routes",
      []() {
        // Every entry of the C++ route tables: (name, primitive, grouped).
        nb::list out;
        for (const auto& r : registered_routes()) {
          out.append(nb::make_tuple(r.name, op_name(r.op), r.grouped));
        }
        return out;
      });
  m.def(
      "conv_inputs",
      [](const mx::array& x,
         const mx::array& w,
         std::shared_ptr<Relation> rel,
         View view,
         const std::string& route,
         int groups,
         std::tuple<bool, bool> flip) {
        return conv_inputs(
            x, w, rel, view, route, {}, groups, {std::get<0>(flip), std::get<1>(flip)});
      },
      "x"_a, "w"_a, "relation"_a.none(), "view"_a, "route"_a, "groups"_a = 1,
      "flip"_a = std::make_tuple(false, false));
  m.def(
      "quantized_conv_inputs",
      [](const mx::array& x,
         const mx::array& codes,
         const mx::array& scales,
         const mx::array& biases,
         int bits,
         int group,
         std::shared_ptr<Relation> rel,
         View view,
         const std::string& route) {
        return quantized_conv_inputs(
            x, codes, scales, biases, bits, group, rel, view,
            route);
      },
      "x"_a, "codes"_a, "scales"_a, "biases"_a, "bits"_a, "group_size"_a,
      "relation"_a.none(), "view"_a, "route"_a);
  m.def(
      "weight_grad_inputs",
      [](const mx::array& x,
         const mx::array& ct,
         std::shared_ptr<Relation> rel,
         View view) {
        return weight_grad_inputs(x, ct, rel, view);
      },
      "x"_a, "ct"_a, "relation"_a.none(), "view"_a);
}

} // namespace mlx_lattice
