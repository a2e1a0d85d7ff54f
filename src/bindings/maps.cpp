// Coordinates and relations: the coordinate range and key packing,
// CoordTable, Relation (with the views a GPU builder provides) and the CPU
// map builders.
#include "bindings/bindings.h"
#include "core/relation.h"
#include "cpu/kernel_map.h"

using namespace nanobind::literals;

namespace mlx_lattice {

namespace {

using Triple = std::tuple<int, int, int>;

KernelSpec make_spec(
    Triple size,
    Triple stride,
    Triple padding,
    Triple dilation) {
  KernelSpec s;
  s.size = {std::get<0>(size), std::get<1>(size), std::get<2>(size)};
  s.stride = {std::get<0>(stride), std::get<1>(stride), std::get<2>(stride)};
  s.padding = {
      std::get<0>(padding), std::get<1>(padding), std::get<2>(padding)};
  s.dilation = {
      std::get<0>(dilation), std::get<1>(dilation), std::get<2>(dilation)};
  for (int a = 0; a < 3; ++a) {
    if (s.size[a] < 1 || s.stride[a] < 1 || s.dilation[a] < 1 ||
        s.padding[a] < 0) {
      throw std::invalid_argument("invalid kernel specification");
    }
  }
  return s;
}

// A view handed to a relation: its dtype and shape, named in the error.
void check_view_array(
    const mx::array& a,
    std::vector<int64_t> shape,
    const char* what,
    mx::Dtype dtype = mx::int32) {
  bool ok = a.dtype() == dtype && a.ndim() == static_cast<int>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) {
    ok = a.shape(static_cast<int>(i)) == shape[i];
  }
  if (!ok) {
    std::string want;
    for (auto d : shape) {
      want += (want.empty() ? "" : ", ") + std::to_string(d);
    }
    throw std::invalid_argument(
        std::string(what) + " must be a (" + want + ") " +
        (dtype == mx::int32 ? "int32" : "uint64") + " array for this relation");
  }
}

} // namespace

void init_maps(nb::module_& m) {
  m.attr("BATCH_LIMIT") = kBatchLimit;
  m.attr("COORD_MIN") = kCoordMin;
  m.attr("COORD_MAX") = kCoordMax;
  // The key packing and table hash every backend shares, as source text
  // for the CUDA backend's kernels.
  m.def("lattice_keys_source", &lattice_keys_source);

  nb::enum_<View>(m, "View")
      .value("output_major", View::OutputMajor)
      .value("input_major", View::InputMajor);

  nb::class_<CoordTable>(m, "CoordTable")
      .def(nb::init<const mx::array&>(), "coords"_a)
      .def_prop_ro("size", &CoordTable::size)
      .def_prop_ro("coords", &CoordTable::coords)
      .def("lookup", &CoordTable::lookup, "queries"_a);

  nb::class_<Relation>(m, "Relation")
      // A relation from CSR arrays built elsewhere (the GPU map builders), in
      // the CPU builder's edge order. out_offsets must be evaluated (the
      // statistics read it); in_idx and k_idx too unless every view they
      // derive is provided (set_* below), as the Metal builder does.
      .def(
          nb::init<std::string, int64_t, int64_t, int64_t, mx::array, mx::array, mx::array>(),
          "kind"_a, "n_in"_a, "n_out"_a, "k"_a, "out_offsets"_a, "in_idx"_a, "k_idx"_a)
      .def("set_neighbor_map", &Relation::set_neighbor_map, "neighbor_map"_a)
      .def(
          "set_symmetric",
          [](Relation& r) {
            // A builder's mark (its geometry pairs the edges); a relation of
            // two sets cannot be one.
            if (r.n_in() != r.n_out()) {
              throw std::invalid_argument("set_symmetric: a symmetric relation maps a set onto itself (n_in == n_out)");
            }
            r.set_symmetric();
          })
      // Views a GPU builder made (mlx_lattice/backends/metal/maps.py); they
      // may be unevaluated. Shapes are checked against the relation's sizes.
      .def(
          "set_out_idx",
          [](Relation& r, const mx::array& out_idx) {
            check_view_array(out_idx, {r.edges()}, "out_idx");
            r.set_out_idx(out_idx);
          },
          "out_idx"_a)
      .def(
          "set_kernel_major",
          [](Relation& r, const mx::array& offsets, const mx::array& perm,
             const mx::array& in_idx, const mx::array& out_idx) {
            check_view_array(offsets, {r.kernel_volume() + 1}, "kernel_major offsets");
            for (const auto* a : {&perm, &in_idx, &out_idx}) {
              check_view_array(*a, {r.edges()}, "kernel_major edges");
            }
            r.set_kernel_major({offsets, perm, in_idx, out_idx});
          },
          "offsets"_a, "perm"_a, "in_idx"_a, "out_idx"_a)
      .def(
          "set_input_major",
          [](Relation& r, const mx::array& offsets, const mx::array& perm,
             const mx::array& out_idx, const mx::array& k_idx) {
            check_view_array(offsets, {r.n_in() + 1}, "input_major offsets");
            for (const auto* a : {&perm, &out_idx, &k_idx}) {
              check_view_array(*a, {r.edges()}, "input_major edges");
            }
            r.set_input_major({offsets, perm, out_idx, k_idx});
          },
          "offsets"_a, "perm"_a, "out_idx"_a, "k_idx"_a)
      .def(
          "set_input_neighbor_map",
          [](Relation& r, const mx::array& map) {
            check_view_array(map, {r.n_in(), r.kernel_volume()}, "input_neighbor_map");
            r.set_input_neighbor_map(map);
          },
          "input_neighbor_map"_a)
      .def(
          "set_sorted_plan",
          [](Relation& r, const mx::array& reorder_rows, const mx::array& out_in_map,
             const mx::array& kv_out_in_map, const mx::array& tile_masks) {
            const int64_t n = r.n_out(), k = r.kernel_volume();
            check_view_array(reorder_rows, {n}, "reorder_rows");
            check_view_array(out_in_map, {n, k}, "sorted_out_in_map");
            check_view_array(kv_out_in_map, {k, n}, "sorted_kv_out_in_map");
            const int64_t tiles = (n + Relation::kPlanTile - 1) / Relation::kPlanTile;
            check_view_array(tile_masks, {tiles}, "tile_masks", mx::uint64);
            r.set_sorted_plan({reorder_rows, out_in_map, kv_out_in_map, tile_masks});
          },
          "reorder_rows"_a, "sorted_out_in_map"_a, "sorted_kv_out_in_map"_a, "tile_masks"_a)
      .def(
          "set_row_order",
          [](Relation& r, View v, const mx::array& order) {
            check_view_array(order, {v == View::OutputMajor ? r.n_out() : r.n_in()}, "row_order");
            r.set_row_order(v, order);
          },
          "view"_a, "order"_a)
      .def("row_order", &Relation::row_order, "view"_a)
      .def_prop_ro("kind", &Relation::kind)
      .def_prop_ro("n_in", &Relation::n_in)
      .def_prop_ro("n_out", &Relation::n_out)
      .def_prop_ro("kernel_volume", &Relation::kernel_volume)
      .def_prop_ro("edges", &Relation::edges)
      .def_prop_ro("out_offsets", &Relation::out_offsets)
      .def_prop_ro("in_idx", &Relation::in_idx)
      .def_prop_ro("k_idx", &Relation::k_idx)
      .def_prop_ro("out_idx", &Relation::out_idx)
      .def_prop_ro("neighbor_map", &Relation::neighbor_map)
      .def_prop_ro("has_neighbor_map", &Relation::has_neighbor_map)
      .def_prop_ro("input_neighbor_map", &Relation::input_neighbor_map)
      .def_prop_ro("max_neighbors", &Relation::max_neighbors)
      .def_prop_ro("symmetric", &Relation::symmetric)
      .def(
          "input_major",
          [](Relation& r) {
            const auto& v = r.input_major();
            return std::make_tuple(v.offsets, v.perm, v.out_idx, v.k_idx);
          })
      .def(
          "kernel_major",
          [](Relation& r) {
            const auto& v = r.kernel_major();
            return std::make_tuple(v.offsets, v.perm, v.in_idx, v.out_idx);
          })
      .def(
          "sorted_plan",
          [](Relation& r) {
            const auto& p = r.sorted_plan();
            return std::make_tuple(
                p.reorder_rows, p.out_in_map, p.kv_out_in_map, p.tile_masks);
          })
      .def_prop_ro_static(
          "plan_tile", [](nb::handle) { return Relation::kPlanTile; })
      .def("swapped", &Relation::swapped, "kind"_a);

  m.def(
      "symmetric_geometry",
      [](Triple k, Triple s, Triple p, Triple d, bool transposed) {
        return symmetric_geometry(make_spec(k, s, p, d), transposed);
      },
      "size"_a, "stride"_a, "padding"_a, "dilation"_a, "transposed"_a);
  m.def(
      "forward_support",
      [](const CoordTable& t, Triple k, Triple s, Triple p, Triple d) {
        return forward_support(t, make_spec(k, s, p, d));
      },
      "table"_a, "size"_a, "stride"_a, "padding"_a, "dilation"_a);
  m.def(
      "generative_support",
      [](const CoordTable& t, Triple k, Triple s, Triple p, Triple d) {
        return generative_support(t, make_spec(k, s, p, d));
      },
      "table"_a, "size"_a, "stride"_a, "padding"_a, "dilation"_a);
  m.def(
      "build_relation",
      [](const CoordTable& t,
         const mx::array& out,
         Triple k,
         Triple s,
         Triple p,
         Triple d,
         bool transposed,
         const std::string& kind,
         const CoordTable* out_table) {
        nb::gil_scoped_release release;
        return build_relation(
            t, out, make_spec(k, s, p, d), transposed, kind, out_table);
      },
      "table"_a, "out_coords"_a, "size"_a, "stride"_a, "padding"_a,
      "dilation"_a, "transposed"_a, "kind"_a, "out_table"_a = nb::none());
}

} // namespace mlx_lattice
