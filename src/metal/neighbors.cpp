// Programs of metal/neighbors.metal: one thread per point or query; the
// scans are map_build.metal's map_scan (one threadgroup).
#include "metal/neighbors.h"

#include "metal/map_build.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

static_assert(sizeof(NeighborParams) == 19 * 4, "NeighborParams: 32-bit fields");

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

const float* checked_points(mx::array& pts, mx::array& b, const char* name) {
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
  if (pts.shape(0) > (int64_t(1) << 30)) {
    throw std::invalid_argument(std::string(name) + ": at most 2^30 points");
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
    double radius,
    int64_t edges) {
  mx::array qa = queries_in, qba = query_batch_in, pa = points_in, pba = point_batch_in;
  const float* q = checked_points(qa, qba, "queries");
  const float* r = checked_points(pa, pba, "points");
  const bool is_radius = radius > 0;
  if (is_radius ? (!std::isfinite(radius) || k < 0) : k < 1) {
    throw std::invalid_argument(
        "neighbour query: k must be positive (knn), or radius positive and "
        "finite with k >= 0 (radius)");
  }
  if (is_radius && !(float(radius) > 0 && std::isfinite(float(radius)))) {
    throw std::invalid_argument("neighbour query: radius must be a positive finite float32");
  }
  if (edges < 0 || edges > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("neighbour query: edges must lie in [0, 2^31 - 1]");
  }
  const int64_t nq = qa.shape(0), n = pa.shape(0);
  NeighborParams p{};
  p.n_query = int(nq);
  p.n_points = int(n);
  p.k = k;
  p.edges = int(edges);
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

Program neighbor_program(const std::string& step, const NeighborParams& p) {
  const bool knn = p.radius == 0.0f;
  if (step == "grid") {
    Step clear = rows_step("nbr_grid_clear", int64_t(p.n_cells) + 2, {output("grid"), bytes(p)});
    Step count = rows_step(
        "nbr_grid_count", p.n_points,
        {input(2, "points"), input(3, "point_batch"), output("grid"), bytes(p)});
    Step fill = count;
    fill.kernel = "nbr_grid_fill";
    return {{}, {clear, count, scan_step(p.n_cells, "grid"), fill}};
  }
  if (step == "knn_count" || step == "radius_count") {
    if (knn != (step == "knn_count")) {
      throw std::invalid_argument("neighbour program: '" + step + "' does not match the query's parameters");
    }
    Step count = knn
        ? rows_step("nbr_knn_count", p.n_query,
                    {input(1, "query_batch"), input(4, "grid"), output("offsets"), bytes(p)})
        : rows_step("nbr_radius_count", p.n_query,
                    {input(0, "queries"), input(1, "query_batch"), input(2, "points"),
                     input(4, "grid"), output("offsets"), bytes(p)});
    return {{}, {count, scan_step(p.n_query, "offsets")}};
  }
  if (step == "knn_fill" || step == "radius_fill") {
    if (knn != (step == "knn_fill")) {
      throw std::invalid_argument("neighbour program: '" + step + "' does not match the query's parameters");
    }
    Step fill = rows_step(
        knn ? "nbr_knn_fill" : "nbr_radius_fill", p.n_query,
        {input(0, "queries"), input(1, "query_batch"), input(2, "points"),
         input(4, "grid"), input(5, "offsets"), output("edges"), bytes(p)});
    return {{}, {fill}};
  }
  throw std::invalid_argument(
      "neighbour step must be 'grid', 'knn_count', 'knn_fill', 'radius_count' "
      "or 'radius_fill', got '" + step + "'");
}

} // namespace mlx_lattice::metal
