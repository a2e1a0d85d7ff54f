// The Metal backend: whether this build has its kernels, and the programs
// eval_gpu encodes, which the test harness reads and runs (map building's
// and neighbour queries' steps also run as primitives, from
// mlx_lattice/backends/metal/).
#include "bindings/bindings.h"
#include "core/norm.h"
#include "core/route_op.h"
#include "metal/map_build.h"
#include "metal/map_primitive.h"
#include "metal/neighbors.h"
#include "metal/norm_act.h"
#include "metal/route.h"

using namespace nanobind::literals;

namespace mlx_lattice {

namespace {

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

} // namespace

void init_metal(nb::module_& m) {
  m.def("metal_available", &metal::available);
  m.def("metal_tensor_ops_kernels", &metal::tensor_ops_kernels);
  m.def(
      "metal_program",
      [](const std::string& primitive,
         const std::string& route,
         const std::vector<mx::array>& inputs,
         std::vector<int> out_shape,
         mx::Dtype out_dtype,
         int groups) {
        mx::Shape shape(out_shape.begin(), out_shape.end());
        return program_dict(
            metal::program(route, op_named(primitive), inputs, shape, out_dtype, groups));
      },
      "primitive"_a, "route"_a, "inputs"_a, "out_shape"_a, "out_dtype"_a, "groups"_a = 1);
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
  // Neighbour queries (routes metal.knn, metal.radius): the parameters of
  // one query, computed on the host once, then each step's program (the
  // harness), outputs and primitive (a Mac; mlx_lattice/backends/metal/neighbors.py).
  nb::class_<NeighborParams>(m, "NeighborParams")
      .def_ro("n_query", &NeighborParams::n_query)
      .def_ro("n_points", &NeighborParams::n_points)
      .def_ro("n_batch", &NeighborParams::n_batch)
      .def_prop_ro("dims", [](const NeighborParams& p) {
        return std::array<int, 3>{p.dims[0], p.dims[1], p.dims[2]};
      })
      .def_ro("n_cells", &NeighborParams::n_cells)
      .def_prop_ro("exact", [](const NeighborParams& p) { return p.exact != 0; })
      .def_ro("k", &NeighborParams::k)
      .def_prop_ro("origin", [](const NeighborParams& p) {
        return std::array<float, 3>{p.origin[0], p.origin[1], p.origin[2]};
      })
      .def_ro("cell", &NeighborParams::cell)
      .def_ro("radius", &NeighborParams::radius)
      .def("__repr__", [](const NeighborParams& p) {
        return "NeighborParams(n_query=" + std::to_string(p.n_query) +
            ", n_points=" + std::to_string(p.n_points) + ", n_cells=" +
            std::to_string(p.n_cells) + ", k=" + std::to_string(p.k) +
            ", radius=" + std::to_string(p.radius) + ", exact=" +
            (p.exact ? "True" : "False") + ")";
      });
  m.def(
      "metal_neighbor_params",
      [](const mx::array& queries, const mx::array& query_batch,
         const mx::array& points, const mx::array& point_batch, int k,
         double radius) {
        return metal::neighbor_params(queries, query_batch, points, point_batch, k, radius);
      },
      "queries"_a, "query_batch"_a, "points"_a, "point_batch"_a, "k"_a,
      "radius"_a = 0.0);
  m.def(
      "metal_neighbor_program",
      [](const std::string& route, const std::string& step, const NeighborParams& p) {
        return program_dict(metal::neighbor_program(route, step, p));
      },
      "route"_a, "step"_a, "params"_a);
  m.def(
      "metal_neighbor_outputs",
      [](const std::string& route, const std::string& step, const NeighborParams& p,
         int64_t edges) {
        nb::list out;
        for (const auto& [shape, dtype] : metal::neighbor_outputs(route, step, p, edges)) {
          out.append(nb::make_tuple(
              std::vector<int>(shape.begin(), shape.end()),
              dtype == mx::int32 ? std::string("int32") : metal::type_name(dtype)));
        }
        return out;
      },
      "route"_a, "step"_a, "params"_a, "edges"_a = 0);
  m.def(
      "metal_neighbor_step",
      [](const std::string& route, const std::string& step,
         const std::vector<mx::array>& inputs, const NeighborParams& p,
         int64_t edges, std::optional<mx::Stream> s) {
        return metal::neighbor_step(route, step, inputs, p, edges, stream_or_default(s));
      },
      "route"_a, "step"_a, "inputs"_a, "params"_a, "edges"_a = 0,
      "stream"_a = nb::none());
  m.def(
      "neighbor_grid",
      [](const mx::array& queries, const mx::array& query_batch,
         const mx::array& points, const mx::array& point_batch, int k,
         double radius) {
        const NeighborParams g = metal::neighbor_params(
            queries, query_batch, points, point_batch, k, radius);
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

} // namespace mlx_lattice
