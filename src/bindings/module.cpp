// Python module mlx_lattice._ext: relation building and the primitives.
#include <nanobind/nanobind.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "core/attention.h"
#include "core/feature_ops.h"
#include "core/norm.h"
#include "core/optim.h"
#include "core/primitives.h"
#include "core/relation.h"
#include "core/threadpool.h"
#include "cpu/allocator.h"
#include "cpu/isa.h"
#include "cpu/neighbors.h"
#include "cpu/routes.h"
#include "metal/map_build.h"
#include "metal/map_primitive.h"
#include "metal/neighbors.h"
#include "metal/norm_act.h"
#include "metal/route.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace mlx_lattice;

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

Op op_named(const std::string& primitive) {
  for (Op op : {Op::Conv, Op::WeightGrad, Op::QuantizedConv}) {
    if (primitive == op_name(op)) {
      return op;
    }
  }
  throw std::invalid_argument(
      "primitive must be 'conv', 'weight_grad' or 'quantized', got '" + primitive + "'");
}

// A Metal program as the harness reads it (tests/metal/metal_programs.py).
nb::dict program_dict(const metal::Program& prog) {
  nb::list temps;
  for (const auto& t : prog.temps) {
    // int32: index temporaries of map building (no kernel dtype suffix).
    temps.append(nb::make_tuple(
        t.dtype == mx::int32 ? std::string("int32") : metal::type_name(t.dtype),
        t.size));
  }
  nb::list steps;
  for (const auto& st : prog.steps) {
    nb::dict d;
    d["kernel"] = st.kernel;
    d["groups"] = nb::make_tuple(st.groups[0], st.groups[1], st.groups[2]);
    d["threads"] =
        nb::make_tuple(st.threads[0], st.threads[1], st.threads[2]);
    nb::list bufs;
    for (const auto& b : st.buffers) {
      const char* kinds[4] = {"input", "output", "temp", "bytes"};
      nb::object payload = b.kind == metal::Binding::Kind::Bytes
          ? nb::object(nb::bytes(
                reinterpret_cast<const char*>(b.bytes.data()),
                b.bytes.size()))
          : nb::object(nb::int_(b.index));
      bufs.append(nb::make_tuple(
          kinds[static_cast<int>(b.kind)], payload, b.name));
    }
    d["buffers"] = bufs;
    steps.append(d);
  }
  nb::dict out;
  out["temps"] = temps;
  out["steps"] = steps;
  return out;
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

mx::Stream stream_or_default(std::optional<mx::Stream> s) {
  return s ? *s : mx::to_stream(mx::StreamOrDevice{});
}

} // namespace

NB_MODULE(_ext, m) {
  m.doc() = "mlx_lattice native core";

  // Heap settings for MLX's malloc-based CPU allocator, before the module
  // allocates anything (src/cpu/allocator.h).
  cpu::tune_malloc_from_env();
  m.def("malloc_tuning", &cpu::malloc_tuning);

  m.attr("BATCH_LIMIT") = kBatchLimit;
  m.attr("COORD_MIN") = kCoordMin;
  m.attr("COORD_MAX") = kCoordMax;

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
      // Views a GPU builder made (mlx_lattice/metal_maps.py); they may be
      // unevaluated. Shapes are checked against the relation's sizes.
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
      .def_prop_ro("input_neighbor_map", &Relation::input_neighbor_map)
      .def_prop_ro("max_neighbors", &Relation::max_neighbors)
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

  m.def(
      "gather_conv",
      [](const mx::array& x,
         const mx::array& w,
         std::shared_ptr<Relation> rel,
         View view,
         const std::string& route,
         std::optional<mx::Stream> s,
         int groups) {
        return gather_conv(
            x, w, rel, view, route, stream_or_default(s), groups);
      },
      "x"_a, "w"_a, "relation"_a.none(), "view"_a, "route"_a,
      "stream"_a = nb::none(), "groups"_a = 1);
  m.def(
      "weight_grad",
      [](const mx::array& x,
         const mx::array& ct,
         std::shared_ptr<Relation> rel,
         View view,
         int64_t k,
         const std::string& route,
         std::optional<mx::Stream> s,
         int groups) {
        return weight_grad(
            x, ct, rel, view, k, route,
            stream_or_default(s), groups);
      },
      "x"_a, "ct"_a, "relation"_a.none(), "view"_a, "k"_a, "route"_a,
      "stream"_a = nb::none(), "groups"_a = 1);

  m.def(
      "norm_act",
      [](const mx::array& x, const mx::array& weight, const mx::array& bias,
         std::optional<mx::array> residual, std::optional<mx::array> segments,
         int n_segments, std::optional<mx::array> mean,
         std::optional<mx::array> var, float eps, int act, float slope,
         std::optional<mx::Stream> s) {
        return norm_act(
            x, weight, bias, residual, segments, n_segments, mean, var, eps,
            act, slope, stream_or_default(s));
      },
      "x"_a, "weight"_a, "bias"_a, "residual"_a.none(), "segments"_a.none(),
      "n_segments"_a, "mean"_a.none(), "var"_a.none(), "eps"_a, "act"_a,
      "slope"_a, "stream"_a = nb::none());

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

  m.def(
      "adam_update",
      [](const mx::array& g, const mx::array& p, const mx::array& m,
         const mx::array& v, const mx::array& scalars, float b1,
         float one_minus_b1, float b2, float one_minus_b2, float eps,
         bool bias_correction, bool decoupled_decay,
         std::optional<mx::Stream> s) {
        cpu::AdamCoefficients k{b1, one_minus_b1, b2, one_minus_b2, eps,
                                bias_correction, decoupled_decay};
        return adam_update(g, p, m, v, scalars, k, stream_or_default(s));
      },
      "gradient"_a, "parameter"_a, "m"_a, "v"_a, "scalars"_a, "b1"_a,
      "one_minus_b1"_a, "b2"_a, "one_minus_b2"_a, "eps"_a,
      "bias_correction"_a, "decoupled_decay"_a, "stream"_a = nb::none());

  m.def(
      "set_route_hook",
      [](nb::object fn) {
        if (fn.is_none()) {
          set_route_hook(nullptr);
          return;
        }
        // Kept for the life of the process: no destructor runs without the GIL.
        auto* held = new nb::object(fn);
        set_route_hook([held](const RouteQuery& q) {
          nb::gil_scoped_acquire gil;
          nb::dict d;
          d["direction"] = q.direction;
          d["kind"] = q.kind;
          d["k"] = q.k;
          d["c_in"] = q.c_in;
          d["c_out"] = q.c_out;
          d["n_in"] = q.n_in;
          d["n_out"] = q.n_out;
          d["edges"] = q.edges;
          d["dtype"] = q.dtype;
          d["gpu"] = q.gpu;
          d["from_route"] = q.from_route;
          d["groups"] = q.groups;
          return nb::cast<std::string>((*held)(d));
        });
      },
      "hook"_a.none());

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

  m.def(
      "knn_query",
      [](const mx::array& q, const mx::array& qb, const mx::array& p,
         const mx::array& pb, int k) {
        nb::gil_scoped_release release;
        return knn_query(q, qb, p, pb, k);
      },
      "queries"_a, "query_batch"_a, "points"_a, "point_batch"_a, "k"_a);
  m.def(
      "radius_query",
      [](const mx::array& q, const mx::array& qb, const mx::array& p,
         const mx::array& pb, double r, int max_neighbors) {
        nb::gil_scoped_release release;
        return radius_query(q, qb, p, pb, r, max_neighbors);
      },
      "queries"_a, "query_batch"_a, "points"_a, "point_batch"_a, "radius"_a,
      "max_neighbors"_a);

  m.def("num_threads", &num_threads);
  m.def("set_num_threads", &set_num_threads, "n"_a);

  // CPU instruction-set path: chosen here, at load, from the CPU or
  // MLX_LATTICE_CPU_ISA (an unsupported name fails the import).
  cpu::select_cpu_isa_from_env();
  m.def("cpu_isa", &cpu::cpu_isa);
  m.def("supported_cpu_isas", &cpu::supported_isas);
  m.def("built_cpu_isas", &cpu::built_isas);
  m.def("set_cpu_isa", &cpu::set_cpu_isa, "name"_a);
#if defined(MLX_LATTICE_NATIVE)
  m.attr("CPU_NATIVE_BUILD") = true;
#else
  m.attr("CPU_NATIVE_BUILD") = false;
#endif

  m.def("metal_available", &metal::available);
  m.def(
      "native_routes",
      []() {
        // Every entry of the C++ route tables: (name, primitive).
        nb::list out;
        for (const auto& r : cpu::routes()) {
          out.append(nb::make_tuple(r.name, op_name(r.op)));
        }
        for (const auto* r : metal::routes()) {
          out.append(nb::make_tuple(r->name, op_name(r->op)));
        }
        return out;
      });
  m.def("metal_tensor_ops_kernels", &metal::tensor_ops_kernels);
  m.def(
      "conv_inputs",
      [](const mx::array& x,
         const mx::array& w,
         std::shared_ptr<Relation> rel,
         View view,
         const std::string& route,
         int groups) {
        return conv_inputs(x, w, rel, view, route, {}, groups);
      },
      "x"_a, "w"_a, "relation"_a.none(), "view"_a, "route"_a, "groups"_a = 1);
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
  m.def(
      "metal_program",
      [](const std::string& primitive,
         const std::string& route,
         const std::vector<mx::array>& inputs,
         std::vector<int> out_shape,
         mx::Dtype out_dtype) {
        mx::Shape shape(out_shape.begin(), out_shape.end());
        return program_dict(
            metal::program(route, op_named(primitive), inputs, shape, out_dtype));
      },
      "primitive"_a, "route"_a, "inputs"_a, "out_shape"_a, "out_dtype"_a);
  m.def(
      "metal_map_program",
      [](const std::string& step, int64_t n_in, int64_t n_out,
         std::array<int, 3> size, std::array<int, 3> stride,
         std::array<int, 3> padding, std::array<int, 3> dilation,
         bool transposed, int64_t edges) {
        return program_dict(metal::map_program(
            step, metal::map_params(n_in, n_out, size, stride, padding,
                                    dilation, transposed, edges)));
      },
      "step"_a, "n_in"_a, "n_out"_a, "size"_a, "stride"_a, "padding"_a,
      "dilation"_a, "transposed"_a, "edges"_a = 0);
  m.def(
      "metal_map_shape",
      [](const std::string& step, int64_t n_in, int64_t n_out,
         std::array<int, 3> size, std::array<int, 3> stride,
         std::array<int, 3> padding, std::array<int, 3> dilation,
         bool transposed, int64_t edges) {
        const auto shape = metal::map_output_shape(
            step, metal::map_params(n_in, n_out, size, stride, padding,
                                    dilation, transposed, edges));
        return std::vector<int>(shape.begin(), shape.end());
      },
      "step"_a, "n_in"_a, "n_out"_a, "size"_a, "stride"_a, "padding"_a,
      "dilation"_a, "transposed"_a, "edges"_a = 0);
  m.def(
      "metal_map_step",
      [](const std::string& step, const std::vector<mx::array>& inputs,
         int64_t n_in, int64_t n_out, std::array<int, 3> size,
         std::array<int, 3> stride, std::array<int, 3> padding,
         std::array<int, 3> dilation, bool transposed, int64_t edges,
         std::optional<mx::Stream> s) {
        return metal::map_step(
            step, inputs,
            metal::map_params(n_in, n_out, size, stride, padding, dilation,
                              transposed, edges),
            stream_or_default(s));
      },
      "step"_a, "inputs"_a, "n_in"_a, "n_out"_a, "size"_a, "stride"_a,
      "padding"_a, "dilation"_a, "transposed"_a, "edges"_a = 0,
      "stream"_a = nb::none());
  m.def(
      "metal_norm_program",
      [](const std::string& direction, int64_t rows, int64_t channels,
         mx::Dtype dtype, int n_segments, bool segmented, bool training,
         bool residual, int act, float slope, float eps) {
        NormSpec spec;
        spec.segments = n_segments;
        spec.segmented = segmented;
        spec.training = training;
        spec.residual = residual;
        spec.act = static_cast<Activation>(act);
        spec.slope = slope;
        spec.eps = eps;
        if (direction != "forward" && direction != "backward") {
          throw std::invalid_argument(
              "direction must be 'forward' or 'backward', got '" + direction + "'");
        }
        if (n_segments < 1 || act < 0 || act > 2) {
          throw std::invalid_argument(
              "n_segments must be >= 1 and act 0 (identity), 1 (relu) or 2 (leaky relu)");
        }
        return program_dict(
            direction == "forward"
                ? metal::norm_forward_program(spec, rows, channels, dtype)
                : metal::norm_backward_program(spec, rows, channels, dtype));
      },
      "direction"_a, "rows"_a, "channels"_a, "dtype"_a, "n_segments"_a,
      "segmented"_a, "training"_a, "residual"_a, "act"_a, "slope"_a, "eps"_a);
  m.def(
      "metal_neighbor_program",
      [](const std::string& step, const mx::array& queries,
         const mx::array& query_batch, const mx::array& points,
         const mx::array& point_batch, int k, double radius, int64_t edges) {
        return program_dict(metal::neighbor_program(
            step, metal::neighbor_params(queries, query_batch, points,
                                         point_batch, k, radius, edges)));
      },
      "step"_a, "queries"_a, "query_batch"_a, "points"_a, "point_batch"_a,
      "k"_a, "radius"_a = 0.0, "edges"_a = 0);
  m.def(
      "neighbor_grid",
      [](const mx::array& queries, const mx::array& query_batch,
         const mx::array& points, const mx::array& point_batch, int k,
         double radius) {
        const NeighborParams g = metal::neighbor_params(
            queries, query_batch, points, point_batch, k, radius, 0);
        nb::dict d;
        d["n_batch"] = g.n_batch;
        d["dims"] = std::array<int, 3>{g.dims[0], g.dims[1], g.dims[2]};
        d["n_cells"] = g.n_cells;
        d["exact"] = g.exact != 0;
        d["origin"] = std::array<float, 3>{g.origin[0], g.origin[1], g.origin[2]};
        d["cell"] = g.cell;
        d["inv_cell"] = g.inv_cell;
        return d;
      },
      "queries"_a, "query_batch"_a, "points"_a, "point_batch"_a, "k"_a,
      "radius"_a = 0.0);
}
