// Programs of metal/neighbors.metal: one thread per point or query; the
// scans are map_build.metal's map_scan (one threadgroup).
#include "metal/neighbors.h"

#include "metal/map_build.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "mlx/ops.h"

static_assert(sizeof(NeighborParams) == 18 * 4, "NeighborParams: 32-bit fields");

namespace mlx_lattice::metal {

namespace {

// Integral coordinates up to this magnitude take exact 64-bit distances.
constexpr double kExactLimit = double(1 << 20);
// The float cell index keeps 2^-4 cell precision below this many cells
// from the origin.
constexpr double kMaxCellsPerAxis = double(1 << 20);

Step scan_step(int rows, const char* name) {
  MapParams m{};
  m.n_out = rows;
  return map_scan_step(m, name);
}

const float* checked_points(mx::array& pts, mx::array& b, const char* name, int64_t most) {
  pts.eval();
  b.eval();
  if (pts.ndim() != 2 || pts.shape(1) != 3 || pts.dtype() != mx::float32 ||
      b.ndim() != 1 || b.dtype() != mx::int32 || b.shape(0) != pts.shape(0) ||
      (pts.size() > 0 && !pts.flags().row_contiguous) ||
      (b.size() > 0 && !b.flags().row_contiguous)) {
    throw std::invalid_argument(
        std::string(name) +
        " must be a row-contiguous (N, 3) float32 array with an (N,) int32 batch");
  }
  if (pts.shape(0) > most) {
    throw std::invalid_argument(
        std::string(name) + ": at most " + std::to_string(most) + " rows, got " +
        std::to_string(pts.shape(0)));
  }
  return pts.size() > 0 ? pts.data<float>() : nullptr;
}

} // namespace

NeighborParams neighbor_params(
    const mx::array& queries_in,
    const mx::array& query_batch_in,
    const mx::array& points_in,
    const mx::array& point_batch_in,
    int k,
    double radius) {
  mx::array qa = queries_in, qba = query_batch_in, pa = points_in, pba = point_batch_in;
  const float* q = checked_points(qa, qba, "queries", kNeighborMaxQueries);
  const float* r = checked_points(pa, pba, "points", kNeighborMaxPoints);
  const bool is_radius = radius > 0;
  if (is_radius ? (!std::isfinite(radius) || k < 0) : k < 1) {
    throw std::invalid_argument(
        "neighbour query: k must be positive (knn), or radius positive and "
        "finite with k >= 0 (radius)");
  }
  if (is_radius && !(float(radius) > 0 && std::isfinite(float(radius)))) {
    throw std::invalid_argument("neighbour query: radius must be a positive finite float32");
  }
  const int64_t nq = qa.shape(0), n = pa.shape(0);
  NeighborParams p{};
  p.n_query = int(nq);
  p.n_points = int(n);
  p.k = k;
  p.radius = is_radius ? float(radius) : 0.0f;

  bool exact = true;
  double lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};
  for (int64_t i = 0; i < 3 * nq; ++i) {
    const double v = q[i];
    exact = exact && v == std::floor(v) && std::abs(v) <= kExactLimit;
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int a = 0; a < 3; ++a) {
      const double v = r[3 * i + a];
      if (!std::isfinite(v)) {
        throw std::invalid_argument("points must be finite");
      }
      exact = exact && v == std::floor(v) && std::abs(v) <= kExactLimit;
      lo[a] = i == 0 ? v : std::min(lo[a], v);
      hi[a] = i == 0 ? v : std::max(hi[a], v);
    }
  }
  p.exact = exact ? 1 : 0;
  int64_t n_batch = 0;
  const int32_t* pb = n > 0 ? pba.data<int32_t>() : nullptr;
  std::vector<int32_t> items(pb, pb + n);
  for (int32_t b : items) {
    if (b < 0) throw std::invalid_argument("point batch indices must be >= 0");
    n_batch = std::max<int64_t>(n_batch, int64_t(b) + 1);
  }
  if (n_batch > (int64_t(1) << 20)) {
    throw std::invalid_argument("neighbour grid: point batch indices must be below 2^20");
  }
  std::sort(items.begin(), items.end());
  const double n_items = double(std::unique(items.begin(), items.end()) - items.begin());

  // Cell side: about k / 2 points per cell (knn, as the CPU) or the radius,
  // widened until the dense grid has at most max(2N, 64, batch items) cells and every
  // coordinate lies within 2^20 cells of the origin.
  const double longest = std::max({hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2]});
  double cell = 1.0;
  if (is_radius) {
    cell = radius;
  } else if (longest > 0) {
    double vol = 1.0;
    for (int a = 0; a < 3; ++a) vol *= std::max(hi[a] - lo[a], 1e-3 * longest);
    cell = std::cbrt(vol * 0.5 * k * n_items / double(n));
  }
  cell = std::max(cell, longest / kMaxCellsPerAxis);
  // (Every batch item up to the largest index has at least one cell.)
  const double limit = double(std::max<int64_t>({2 * n, 64, n_batch}));
  int64_t dims[3];
  for (;;) {
    double total = double(n_batch);
    for (int a = 0; a < 3; ++a) {
      dims[a] = int64_t(std::floor((hi[a] - lo[a]) / cell)) + 1;
      total *= double(dims[a]);
    }
    if (total <= limit) break;
    cell *= 1.25;
  }
  p.n_batch = int(n_batch);
  p.n_cells = int(n_batch * dims[0] * dims[1] * dims[2]);
  for (int a = 0; a < 3; ++a) {
    p.dims[a] = int(dims[a]);
    p.origin[a] = float(lo[a]);
  }
  p.cell = float(cell);
  p.inv_cell = float(1.0 / cell);
  if (is_radius) {
    // Exact: d2 <= r^2 (double) iff d2 <= floor(r^2) for integral d2.
    const double r2 = std::min(std::floor(radius * radius), 4e18);
    const int64_t r2i = int64_t(r2);
    p.r2_lo = int32_t(uint32_t(uint64_t(r2i) & 0xffffffffu));
    p.r2_hi = int32_t(r2i >> 32);
    p.r2 = float(radius * radius);
  }
  return p;
}

namespace {

// The route table: each Metal neighbour route and the queries it runs.
struct NeighborRoute {
  const char* name;
  bool knn;
};
constexpr NeighborRoute kNeighborRoutes[] = {{"metal.knn", true}, {"metal.radius", false}};

// Whether `route` runs k-nearest queries; it must match the parameters.
bool knn_route(const std::string& route, const NeighborParams& p) {
  for (const auto& r : kNeighborRoutes) {
    if (route == r.name) {
      if (r.knn != (p.radius == 0.0f)) {
        throw std::invalid_argument(
            "neighbour route '" + route + "' runs " + (r.knn ? "k-nearest" : "radius") +
            " queries; the parameters are a " + (r.knn ? "radius" : "k-nearest") + " query's");
      }
      return r.knn;
    }
  }
  throw std::invalid_argument(
      "no Metal neighbour route named '" + route + "' (metal.knn, metal.radius)");
}

[[noreturn]] void unknown_step(const std::string& step) {
  throw std::invalid_argument(
      "neighbour step must be 'grid', 'count' or 'fill', got '" + step + "'");
}

} // namespace

Program neighbor_program(const std::string& route, const std::string& step, const NeighborParams& p) {
  const bool knn = knn_route(route, p);
  if (step == "grid") {
    Step clear = rows_step("nbr_grid_clear", int64_t(p.n_cells) + 2, {output("grid"), bytes(p)});
    Step count = rows_step(
        "nbr_grid_count", p.n_points,
        {input(2, "points"), input(3, "point_batch"), output("grid"), bytes(p)});
    Step fill = count;
    fill.kernel = "nbr_grid_fill";
    return {{}, {clear, count, scan_step(p.n_cells, "grid"), fill}};
  }
  if (step == "count") {
    Step count = knn
        ? rows_step("nbr_knn_count", p.n_query,
                    {input(1, "query_batch"), input(4, "grid"), output("offsets"), bytes(p)})
        : rows_step("nbr_radius_count", p.n_query,
                    {input(0, "queries"), input(1, "query_batch"), input(2, "points"),
                     input(4, "grid"), output("offsets"), bytes(p)});
    return {{}, {count, scan_step(p.n_query, "offsets")}};
  }
  if (step == "fill") {
    Step fill = rows_step(
        knn ? "nbr_knn_fill" : "nbr_radius_fill", p.n_query,
        {input(0, "queries"), input(1, "query_batch"), input(2, "points"), input(4, "grid"),
         input(5, "offsets"), output(0, "indices"), output(1, "distances"), bytes(p)});
    return {{}, {fill}};
  }
  unknown_step(step);
}

std::vector<std::pair<mx::Shape, mx::Dtype>> neighbor_outputs(
    const std::string& route,
    const std::string& step,
    const NeighborParams& p,
    int64_t edges) {
  knn_route(route, p);
  constexpr int64_t most = std::numeric_limits<int32_t>::max();
  if (step == "grid") {
    const int64_t words = int64_t(p.n_cells) + 2 + p.n_points;
    if (words > most) {
      throw std::invalid_argument("neighbour grid: " + std::to_string(words) + " words exceed an int32 dimension");
    }
    return {{{int32_t(words)}, mx::int32}};
  }
  if (step == "count") {
    return {{{int32_t(int64_t(p.n_query) + 1)}, mx::int32}};
  }
  if (step == "fill") {
    // A query without edges has no fill (Metal buffers are never empty).
    if (edges < 1 || edges > most) {
      throw std::invalid_argument(
          "neighbour fill: edges must lie in [1, 2^31 - 1], got " + std::to_string(edges));
    }
    return {{{int32_t(edges)}, mx::int32}, {{int32_t(edges)}, mx::float32}};
  }
  unknown_step(step);
}

void NeighborStep::eval_cpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error(
      "Metal neighbour queries run on a Metal GPU stream; the CPU runs _ext.knn_query / _ext.radius_query");
}

void NeighborStep::eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
#ifdef MLX_LATTICE_METAL
  run(neighbor_program(route_, step_, p_), in, out, stream());
#else
  (void)in;
  (void)out;
  throw std::runtime_error("mlx_lattice was built without Metal: no Metal neighbour queries");
#endif
}

bool NeighborStep::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const NeighborStep&>(other);
  return route_ == o.route_ && step_ == o.step_ &&
      std::memcmp(&p_, &o.p_, sizeof(NeighborParams)) == 0;
}

std::vector<mx::array> neighbor_step(
    const std::string& route,
    const std::string& step,
    const std::vector<mx::array>& inputs,
    const NeighborParams& p,
    int64_t edges,
    mx::Stream s) {
  const auto outs = neighbor_outputs(route, step, p, edges);
  // What each input must be: the kernels index them by the parameters.
  const int q = p.n_query, n = p.n_points;
  const std::vector<std::tuple<const char*, mx::Shape, mx::Dtype>> expect = {
      {"queries", {q, 3}, mx::float32},
      {"query_batch", {q}, mx::int32},
      {"points", {n, 3}, mx::float32},
      {"point_batch", {n}, mx::int32},
      {"grid", {int32_t(int64_t(p.n_cells) + 2 + n)}, mx::int32},
      {"offsets", {q + 1}, mx::int32},
  };
  const size_t need = step == "grid" ? 4 : step == "count" ? 5 : 6;
  if (inputs.size() != need) {
    throw std::invalid_argument(
        "neighbour step '" + step + "' takes " + std::to_string(need) + " inputs, got " +
        std::to_string(inputs.size()));
  }
  std::vector<mx::array> contiguous;
  for (size_t i = 0; i < need; ++i) {
    const auto& [name, shape, dtype] = expect[i];
    if (inputs[i].shape() != shape || inputs[i].dtype() != dtype) {
      throw std::invalid_argument(
          std::string("neighbour step '") + step + "': " + name +
          " does not match the query's parameters (shape or dtype)");
    }
    contiguous.push_back(mx::contiguous(inputs[i], false, s));
  }
  std::vector<mx::Shape> shapes;
  std::vector<mx::Dtype> dtypes;
  for (const auto& [shape, dtype] : outs) {
    shapes.push_back(shape);
    dtypes.push_back(dtype);
  }
  return mx::array::make_arrays(
      std::move(shapes), dtypes, std::make_shared<NeighborStep>(s, route, step, p), contiguous);
}

} // namespace mlx_lattice::metal
