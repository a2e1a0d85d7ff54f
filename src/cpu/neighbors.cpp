#include "cpu/neighbors.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/relation.h"
#include "core/threadpool.h"
#include "mlx/allocator.h"

namespace mlx_lattice {

namespace {

// Queries per task: fixed, so chunk boundaries (and the per-chunk buffers
// the radius search fills) never depend on the thread count.
constexpr int64_t kQueryGrain = 512;
// Cell coordinates must stay far from int64 overflow.
constexpr double kMaxCell = 1e15;

struct Cell {
  int32_t b;
  int64_t x, y, z;
  bool operator==(const Cell& o) const {
    return b == o.b && x == o.x && y == o.y && z == o.z;
  }
};

struct CellHash {
  size_t operator()(const Cell& c) const {
    uint64_t h = uint64_t(c.b) * 0x9E3779B97F4A7C15ull;
    for (int64_t v : {c.x, c.y, c.z}) {
      h ^= uint64_t(v) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    }
    return size_t(h);
  }
};

using Hit = std::pair<double, int32_t>; // (squared distance, reference index)

struct PointSet {
  const float* p;
  const int32_t* b;
  int64_t n;
};

void check_points(const mx::array& pts, const mx::array& batch, const char* name) {
  const std::string s(name);
  if (pts.ndim() != 2 || pts.shape(1) != 3 || pts.dtype() != mx::float32) {
    throw std::invalid_argument(s + " must be an (N, 3) float32 array");
  }
  if (batch.ndim() != 1 || batch.dtype() != mx::int32 ||
      batch.shape(0) != pts.shape(0)) {
    throw std::invalid_argument(s + " batch must be an (N,) int32 array");
  }
  if ((pts.size() > 0 && !pts.flags().row_contiguous) ||
      (batch.size() > 0 && !batch.flags().row_contiguous)) {
    throw std::invalid_argument(s + " must be row-contiguous");
  }
}

PointSet view(mx::array& pts, mx::array& batch, const char* name) {
  pts.eval();
  batch.eval();
  check_points(pts, batch, name);
  const int64_t n = pts.shape(0);
  return {n > 0 ? pts.data<float>() : nullptr,
          n > 0 ? batch.data<int32_t>() : nullptr, n};
}

// Reference points bucketed in cubic cells of side `cell`, per batch item.
class Grid {
 public:
  Grid(const PointSet& ref, double cell) : ref_(ref), inv_(1.0 / cell) {
    const int64_t n = ref.n;
    std::vector<std::pair<Cell, int32_t>> keyed(n);
    for (int64_t i = 0; i < n; ++i) {
      keyed[i] = {cell_of(ref.p + 3 * i, ref.b[i]), int32_t(i)};
    }
    std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& c) {
      const Cell &u = a.first, &v = c.first;
      if (u.b != v.b) return u.b < v.b;
      if (u.x != v.x) return u.x < v.x;
      if (u.y != v.y) return u.y < v.y;
      if (u.z != v.z) return u.z < v.z;
      return a.second < c.second;
    });
    order_.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      order_[i] = keyed[i].second;
      const Cell& c = keyed[i].first;
      auto [it, fresh] = cells_.try_emplace(c, int32_t(i), int32_t(i + 1));
      if (!fresh) it->second.second = int32_t(i + 1);
      auto [bt, bfresh] = bounds_.try_emplace(
          c.b, std::array<int64_t, 7>{c.x, c.y, c.z, c.x, c.y, c.z, 0});
      auto& bb = bt->second;
      bb[0] = std::min(bb[0], c.x), bb[3] = std::max(bb[3], c.x);
      bb[1] = std::min(bb[1], c.y), bb[4] = std::max(bb[4], c.y);
      bb[2] = std::min(bb[2], c.z), bb[5] = std::max(bb[5], c.z);
      bb[6] += 1; // points in this batch item
    }
  }

  Cell cell_of(const float* q, int32_t b) const {
    return {b, int64_t(std::floor(double(q[0]) * inv_)),
            int64_t(std::floor(double(q[1]) * inv_)),
            int64_t(std::floor(double(q[2]) * inv_))};
  }

  // Cell bounds (min xyz, max xyz, count) of a batch item, or null.
  const std::array<int64_t, 7>* bounds(int32_t b) const {
    auto it = bounds_.find(b);
    return it == bounds_.end() ? nullptr : &it->second;
  }

  template <typename F>
  void visit(const Cell& c, F&& fn) const {
    auto it = cells_.find(c);
    if (it == cells_.end()) return;
    for (int32_t i = it->second.first; i < it->second.second; ++i) {
      fn(order_[i]);
    }
  }

  double dist2(const float* q, int32_t j) const {
    const float* r = ref_.p + 3 * int64_t(j);
    const double dx = double(q[0]) - double(r[0]);
    const double dy = double(q[1]) - double(r[1]);
    const double dz = double(q[2]) - double(r[2]);
    return dx * dx + dy * dy + dz * dz;
  }

 private:
  PointSet ref_;
  double inv_;
  std::vector<int32_t> order_;
  std::unordered_map<Cell, std::pair<int32_t, int32_t>, CellHash> cells_;
  std::unordered_map<int32_t, std::array<int64_t, 7>> bounds_;
};

void check_finite(const PointSet& s, const char* name, double* max_abs) {
  for (int64_t i = 0; i < 3 * s.n; ++i) {
    const double v = s.p[i];
    if (!std::isfinite(v)) {
      throw std::invalid_argument(
          std::string(name) + " must be finite (row " + std::to_string(i / 3) + ")");
    }
    *max_abs = std::max(*max_abs, std::abs(v));
  }
}

// Queries and reference points, evaluated and checked (shapes, dtypes,
// finite); the arrays keep the views' data alive. max_abs: the largest
// coordinate magnitude of either set.
struct QuerySets {
  mx::array qa, qba, pa, pba;
  PointSet q, ref;
  double max_abs = 0;

  QuerySets(
      const mx::array& queries,
      const mx::array& query_batch,
      const mx::array& points,
      const mx::array& point_batch)
      : qa(queries), qba(query_batch), pa(points), pba(point_batch) {
    q = view(qa, qba, "queries");
    ref = view(pa, pba, "points");
    check_finite(q, "queries", &max_abs);
    check_finite(ref, "points", &max_abs);
  }
};

mx::array make_float32(int64_t n) {
  return mx::array(
      mx::allocator::malloc(std::max<int64_t>(n, 1) * sizeof(float)),
      {static_cast<int>(n)},
      mx::float32);
}

void check_edges(int64_t e) {
  if (e > int64_t(INT32_MAX)) {
    throw std::invalid_argument(
        "the relation would hold " + std::to_string(e) +
        " edges, more than int32 offsets address; use a smaller radius or max_neighbors");
  }
}

bool hit_less(const Hit& a, const Hit& b) {
  return a.first < b.first || (a.first == b.first && a.second < b.second);
}

} // namespace

NeighborCSR knn_query(
    const mx::array& queries_in,
    const mx::array& query_batch_in,
    const mx::array& points_in,
    const mx::array& point_batch_in,
    int k) {
  if (k < 1) throw std::invalid_argument("k must be positive");
  const QuerySets sets(queries_in, query_batch_in, points_in, point_batch_in);
  const PointSet &q = sets.q, &ref = sets.ref;
  const double max_abs = sets.max_abs;

  // Cell side: about k / 2 points of a batch item per cell, from the
  // reference bounding box (flat sets: each side at least 1e-3 of the longest).
  std::array<double, 3> lo{0, 0, 0}, hi{0, 0, 0};
  for (int64_t i = 0; i < ref.n; ++i) {
    for (int a = 0; a < 3; ++a) {
      const double v = ref.p[3 * i + a];
      lo[a] = i == 0 ? v : std::min(lo[a], v);
      hi[a] = i == 0 ? v : std::max(hi[a], v);
    }
  }
  const double longest = std::max({hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2]});
  std::vector<int32_t> batches(ref.b, ref.b + ref.n);
  std::sort(batches.begin(), batches.end());
  const double n_items = double(std::unique(batches.begin(), batches.end()) - batches.begin());
  double cell = 1.0;
  if (longest > 0) {
    double vol = 1.0;
    for (int a = 0; a < 3; ++a) vol *= std::max(hi[a] - lo[a], 1e-3 * longest);
    cell = std::cbrt(vol * 0.5 * k * n_items / double(ref.n));
  }
  cell = std::max(cell, max_abs / kMaxCell);
  const Grid grid(ref, cell);

  mx::array offsets = make_int32(q.n + 1);
  int32_t* off = offsets.data<int32_t>();
  off[0] = 0;
  int64_t total = 0;
  for (int64_t i = 0; i < q.n; ++i) {
    const auto* bb = grid.bounds(q.b[i]);
    total += bb ? std::min<int64_t>(k, (*bb)[6]) : 0;
    check_edges(total);
    off[i + 1] = int32_t(total);
  }
  mx::array indices = make_int32(total);
  mx::array distances = make_float32(total);
  int32_t* idx = indices.data<int32_t>();
  float* dist = distances.data<float>();

  parallel_for(q.n, kQueryGrain, [&](int64_t begin, int64_t end) {
    std::vector<Hit> heap; // max-heap of the best hits so far
    for (int64_t i = begin; i < end; ++i) {
      const int want = off[i + 1] - off[i];
      if (want == 0) continue;
      const float* qp = q.p + 3 * i;
      const Cell c = grid.cell_of(qp, q.b[i]);
      const auto& bb = *grid.bounds(q.b[i]);
      const int64_t cq[3] = {c.x, c.y, c.z};
      // First ring that can touch the item's cells, and the last one needed.
      int64_t r0 = 0, reach = 0;
      for (int a = 0; a < 3; ++a) {
        r0 = std::max({r0, bb[a] - cq[a], cq[a] - bb[a + 3]});
        reach = std::max({reach, cq[a] - bb[a], bb[a + 3] - cq[a]});
      }
      heap.clear();
      auto offer = [&](int32_t j) {
        const Hit h{grid.dist2(qp, j), j};
        if (int(heap.size()) < want) {
          heap.push_back(h);
          std::push_heap(heap.begin(), heap.end(), hit_less);
        } else if (hit_less(h, heap.front())) {
          std::pop_heap(heap.begin(), heap.end(), hit_less);
          heap.back() = h;
          std::push_heap(heap.begin(), heap.end(), hit_less);
        }
      };
      for (int64_t r = r0; r <= reach; ++r) {
        // Cells of the shell max(|d|) == r, clipped to the item's bounds.
        int64_t lo3[3], hi3[3];
        for (int a = 0; a < 3; ++a) {
          lo3[a] = std::max(-r, bb[a] - cq[a]);
          hi3[a] = std::min(r, bb[a + 3] - cq[a]);
        }
        for (int64_t dx = lo3[0]; dx <= hi3[0]; ++dx) {
          for (int64_t dy = lo3[1]; dy <= hi3[1]; ++dy) {
            auto at = [&](int64_t dz) {
              grid.visit(Cell{c.b, cq[0] + dx, cq[1] + dy, cq[2] + dz}, offer);
            };
            if (dx == -r || dx == r || dy == -r || dy == r) {
              for (int64_t dz = lo3[2]; dz <= hi3[2]; ++dz) at(dz);
            } else {
              // Interior column: only its two end cells are on the shell.
              if (-r >= lo3[2] && -r <= hi3[2]) at(-r);
              if (r >= lo3[2] && r <= hi3[2]) at(r);
            }
          }
        }
        // Unvisited cells lie at least r cells away (a 1% margin covers
        // rounding in the cell index).
        if (int(heap.size()) == want && r > 0) {
          const double bound = (double(r) - 0.01) * cell;
          if (heap.front().first < bound * bound) break;
        }
      }
      std::sort_heap(heap.begin(), heap.end(), hit_less);
      for (int t = 0; t < want; ++t) {
        idx[off[i] + t] = heap[t].second;
        dist[off[i] + t] = float(std::sqrt(heap[t].first));
      }
    }
  });
  return {offsets, indices, distances};
}

NeighborCSR radius_query(
    const mx::array& queries_in,
    const mx::array& query_batch_in,
    const mx::array& points_in,
    const mx::array& point_batch_in,
    double radius,
    int max_neighbors) {
  if (!(radius > 0) || !std::isfinite(radius)) {
    throw std::invalid_argument("radius must be positive and finite");
  }
  if (max_neighbors < 0) throw std::invalid_argument("max_neighbors must be >= 0");
  const QuerySets sets(queries_in, query_batch_in, points_in, point_batch_in);
  const PointSet &q = sets.q, &ref = sets.ref;
  const double max_abs = sets.max_abs;
  // Slightly wider than the radius so a neighbour's cell index never differs
  // by more than one on any axis, whatever the rounding.
  const double cell = radius * 1.001;
  if (max_abs / cell > kMaxCell) {
    throw std::invalid_argument(
        "radius is too small for the coordinate magnitudes (cell index overflow)");
  }
  const Grid grid(ref, cell);
  const double r2 = radius * radius;

  const int64_t n_chunks = (q.n + kQueryGrain - 1) / kQueryGrain;
  std::vector<std::vector<Hit>> found(n_chunks);
  std::vector<int64_t> counts(q.n, 0);
  parallel_for(q.n, kQueryGrain, [&](int64_t begin, int64_t end) {
    std::vector<Hit>& out = found[begin / kQueryGrain];
    std::vector<Hit> hits;
    for (int64_t i = begin; i < end; ++i) {
      const float* qp = q.p + 3 * i;
      const Cell c = grid.cell_of(qp, q.b[i]);
      hits.clear();
      for (int64_t dx = -1; dx <= 1; ++dx) {
        for (int64_t dy = -1; dy <= 1; ++dy) {
          for (int64_t dz = -1; dz <= 1; ++dz) {
            grid.visit(Cell{c.b, c.x + dx, c.y + dy, c.z + dz}, [&](int32_t j) {
              const double d2 = grid.dist2(qp, j);
              if (d2 <= r2) hits.push_back({d2, j});
            });
          }
        }
      }
      std::sort(hits.begin(), hits.end(), hit_less);
      if (max_neighbors > 0 && int64_t(hits.size()) > max_neighbors) {
        hits.resize(max_neighbors);
      }
      counts[i] = int64_t(hits.size());
      out.insert(out.end(), hits.begin(), hits.end());
    }
  });

  mx::array offsets = make_int32(q.n + 1);
  int32_t* off = offsets.data<int32_t>();
  off[0] = 0;
  int64_t total = 0;
  for (int64_t i = 0; i < q.n; ++i) {
    total += counts[i];
    check_edges(total);
    off[i + 1] = int32_t(total);
  }
  mx::array indices = make_int32(total);
  mx::array distances = make_float32(total);
  int32_t* idx = indices.data<int32_t>();
  float* dist = distances.data<float>();
  parallel_for(n_chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      int64_t at = off[ch * kQueryGrain];
      for (const Hit& h : found[ch]) {
        idx[at] = h.second;
        dist[at++] = float(std::sqrt(h.first));
      }
    }
  });
  return {offsets, indices, distances};
}

} // namespace mlx_lattice
