// Neighbour queries on the GPU: k nearest and fixed radius, with the CPU's
// results (src/cpu/neighbors.cpp): each query's neighbours of its own batch
// item sorted by (squared distance, index). Buffer bindings and dispatch
// shapes: the programs in src/metal/neighbors.cpp.
//
// Reference points are bucketed in a dense grid of cubic cells per batch
// item (count, scan, fill). The grid buffer holds n_cells + 2 words, then
// the point order: after the fill, cell c holds order[grid[c + 1] ..
// grid[c + 2]). The cell index along an axis is floor((x - origin) /
// cell) clamped to the grid, a monotone function of x, so range searches
// padded by one cell are exact whatever the float rounding (the host keeps
// coordinates within 2^20 cells of the origin).
//
// Distances: with integral coordinates (exact = 1) squared distances are
// 64-bit integers, equal to the CPU's doubles, so neighbours, order and the
// radius boundary match it exactly; otherwise they are float32 (fma), and
// near-ties and points within float rounding of the radius may differ.
// Each query's neighbours live in its slice of the index output: a bounded
// max-heap of point indices (keys recomputed from the coordinates), sorted
// in place once the search ends, so a query costs O(visited * log kept)
// comparisons whatever k or the number of points within the radius.
#include <metal_stdlib>

#include "neighbor_params.h"

using namespace metal;

struct NbrQuery {
  float3 q;   // coordinates
  int3 qi;    // the same, integral (exact mode)
  int3 cell;  // grid cell (clamped)
  int b;      // batch item
};

inline int nbr_axis(float x, constant NeighborParams& p, int a) {
  const float t = floor((x - p.origin[a]) * p.inv_cell);
  return int(clamp(t, 0.0f, float(p.dims[a] - 1)));
}

inline int nbr_cell(int b, int x, int y, int z, constant NeighborParams& p) {
  return ((b * p.dims[0] + x) * p.dims[1] + y) * p.dims[2] + z;
}

inline float3 nbr_point(device const float* pts, int i) {
  return float3(pts[3 * i], pts[3 * i + 1], pts[3 * i + 2]);
}

inline int nbr_point_cell(device const float* pts, int i, int b, constant NeighborParams& p) {
  const float3 v = nbr_point(pts, i);
  return nbr_cell(b, nbr_axis(v.x, p, 0), nbr_axis(v.y, p, 1), nbr_axis(v.z, p, 2), p);
}

inline NbrQuery nbr_query(device const float* qs, device const int* qb, int i, constant NeighborParams& p) {
  NbrQuery r;
  r.q = nbr_point(qs, i);
  r.qi = p.exact != 0 ? int3(r.q) : int3(0); // integral only in exact mode
  r.cell = int3(nbr_axis(r.q.x, p, 0), nbr_axis(r.q.y, p, 1), nbr_axis(r.q.z, p, 2));
  r.b = qb[i];
  return r;
}

inline long nbr_d2_exact(thread const NbrQuery& q, device const float* pts, int j) {
  const int3 d = int3(nbr_point(pts, j)) - q.qi;
  return long(d.x) * d.x + long(d.y) * d.y + long(d.z) * d.z;
}

inline float nbr_d2_float(thread const NbrQuery& q, device const float* pts, int j) {
  const float3 d = nbr_point(pts, j) - q.q;
  return fma(d.z, d.z, fma(d.y, d.y, d.x * d.x));
}

// (distance, index) order of points a and b seen from q.
inline bool nbr_less(thread const NbrQuery& q, device const float* pts, int a, int b, constant NeighborParams& p) {
  if (p.exact != 0) {
    const long da = nbr_d2_exact(q, pts, a), db = nbr_d2_exact(q, pts, b);
    return da < db || (da == db && a < b);
  }
  const float da = nbr_d2_float(q, pts, a), db = nbr_d2_float(q, pts, b);
  return da < db || (da == db && a < b);
}

inline bool nbr_within(thread const NbrQuery& q, device const float* pts, int j, constant NeighborParams& p) {
  if (p.exact != 0) {
    const long r2 = (long(p.r2_hi) << 32) | long(uint(p.r2_lo));
    return nbr_d2_exact(q, pts, j) <= r2;
  }
  return nbr_d2_float(q, pts, j) <= p.r2;
}

inline float nbr_distance(thread const NbrQuery& q, device const float* pts, int j, constant NeighborParams& p) {
  return p.exact != 0 ? sqrt(float(nbr_d2_exact(q, pts, j))) : sqrt(nbr_d2_float(q, pts, j));
}

// Restores the max-heap heap[0 .. m) below position at (the root holds
// the largest kept key).
inline void nbr_sift_down(
    thread const NbrQuery& q,
    device const float* pts,
    device int* heap,
    int at,
    int m,
    constant NeighborParams& p) {
  const int j = heap[at];
  for (;;) {
    int c = 2 * at + 1;
    if (c >= m) {
      break;
    }
    if (c + 1 < m && nbr_less(q, pts, heap[c], heap[c + 1], p)) {
      ++c;
    }
    if (!nbr_less(q, pts, j, heap[c], p)) {
      break;
    }
    heap[at] = heap[c];
    at = c;
  }
  heap[at] = j;
}

// Offers point j to the heap[0 .. m) of capacity want: kept while it holds
// fewer than want points, else in place of the root when nearer.
inline void nbr_offer(
    thread const NbrQuery& q,
    device const float* pts,
    int j,
    device int* heap,
    thread int& m,
    int want,
    constant NeighborParams& p) {
  if (m < want) {
    int at = m++;
    while (at > 0) {
      const int up = (at - 1) / 2;
      if (!nbr_less(q, pts, heap[up], j, p)) {
        break;
      }
      heap[at] = heap[up];
      at = up;
    }
    heap[at] = j;
  } else if (nbr_less(q, pts, j, heap[0], p)) {
    heap[0] = j;
    nbr_sift_down(q, pts, heap, 0, want, p);
  }
}

// The heap[0 .. m) in ascending (distance, index) order, in place.
inline void nbr_sort(
    thread const NbrQuery& q,
    device const float* pts,
    device int* heap,
    int m,
    constant NeighborParams& p) {
  for (int end = m - 1; end > 0; --end) {
    const int top = heap[0];
    heap[0] = heap[end];
    heap[end] = top;
    nbr_sift_down(q, pts, heap, 0, end, p);
  }
}

// Offers every point of cell c.
inline void nbr_visit(
    thread const NbrQuery& q,
    device const float* pts,
    device const int* grid,
    int c,
    device int* heap,
    thread int& m,
    int want,
    constant NeighborParams& p) {
  device const int* order = grid + p.n_cells + 2;
  for (int s = grid[c + 1]; s < grid[c + 2]; ++s) {
    nbr_offer(q, pts, order[s], heap, m, want, p);
  }
}

// Points of the query's item (0 when it has none in the grid).
inline int nbr_item_points(device const int* grid, int b, constant NeighborParams& p) {
  if (b < 0 || b >= p.n_batch) {
    return 0;
  }
  const int g = p.dims[0] * p.dims[1] * p.dims[2];
  return grid[(b + 1) * g + 1] - grid[b * g + 1];
}

// ---------------------------------------------------------------- the grid

// Clear: grid[0 .. n_cells] = 0, grid[n_cells + 1] = n_points (the end of
// the last cell, never touched by the fill).
[[kernel]] void nbr_grid_clear(
    device int* grid [[buffer(0)]],
    constant NeighborParams& p [[buffer(1)]],
    uint i [[thread_position_in_grid]]) {
  if (int(i) <= p.n_cells) {
    grid[i] = 0;
  } else if (int(i) == p.n_cells + 1) {
    grid[i] = p.n_points;
  }
}

// Count: grid[c + 1] = points in cell c (map_scan then makes the ends).
[[kernel]] void nbr_grid_count(
    device const float* pts [[buffer(0)]],
    device const int* batch [[buffer(1)]],
    device atomic_int* grid [[buffer(2)]],
    constant NeighborParams& p [[buffer(3)]],
    uint i [[thread_position_in_grid]]) {
  if (int(i) >= p.n_points) {
    return;
  }
  const int c = nbr_point_cell(pts, int(i), batch[i], p);
  atomic_fetch_add_explicit(grid + c + 1, 1, memory_order_relaxed);
}

// Fill: each point takes a slot below its cell's end, which leaves
// grid[c + 1] at the cell's start. The order within a cell depends on the
// schedule; no result does (keys are totally ordered).
[[kernel]] void nbr_grid_fill(
    device const float* pts [[buffer(0)]],
    device const int* batch [[buffer(1)]],
    device atomic_int* grid [[buffer(2)]],
    constant NeighborParams& p [[buffer(3)]],
    uint i [[thread_position_in_grid]]) {
  if (int(i) >= p.n_points) {
    return;
  }
  const int c = nbr_point_cell(pts, int(i), batch[i], p);
  const int slot = atomic_fetch_sub_explicit(grid + c + 1, 1, memory_order_relaxed) - 1;
  atomic_store_explicit(grid + p.n_cells + 2 + slot, int(i), memory_order_relaxed);
}

// ------------------------------------------------------------ k nearest

// Count: offsets[i + 1] = min(k, points of the query's item).
[[kernel]] void nbr_knn_count(
    device const int* qbatch [[buffer(0)]],
    device const int* grid [[buffer(1)]],
    device int* offsets [[buffer(2)]],
    constant NeighborParams& p [[buffer(3)]],
    uint i [[thread_position_in_grid]]) {
  if (i == 0) {
    offsets[0] = 0;
  }
  if (int(i) >= p.n_query) {
    return;
  }
  offsets[i + 1] = min(p.k, nbr_item_points(grid, qbatch[i], p));
}

// Fill: each query's neighbour indices and distances at offsets[i]. Cells
// are visited in shells of growing Chebyshev radius r around the query's
// cell; after shell r every unvisited point lies at least (r - 1) cells
// away (one cell of slack for rounding), so the search stops once the heap
// is full and its largest key is below that.
[[kernel]] void nbr_knn_fill(
    device const float* qs [[buffer(0)]],
    device const int* qbatch [[buffer(1)]],
    device const float* pts [[buffer(2)]],
    device const int* grid [[buffer(3)]],
    device const int* offsets [[buffer(4)]],
    device int* indices [[buffer(5)]],
    device float* distances [[buffer(6)]],
    constant NeighborParams& p [[buffer(7)]],
    uint i [[thread_position_in_grid]]) {
  if (int(i) >= p.n_query) {
    return;
  }
  const int base = offsets[i];
  const int want = offsets[i + 1] - base;
  if (want == 0) {
    return;
  }
  const NbrQuery q = nbr_query(qs, qbatch, int(i), p);
  device int* heap = indices + base;
  int m = 0;
  int reach = 0;
  for (int a = 0; a < 3; ++a) {
    reach = max(reach, max(q.cell[a], p.dims[a] - 1 - q.cell[a]));
  }
  for (int r = 0; r <= reach; ++r) {
    int lo[3], hi[3];
    for (int a = 0; a < 3; ++a) {
      lo[a] = max(-r, -q.cell[a]);
      hi[a] = min(r, p.dims[a] - 1 - q.cell[a]);
    }
    for (int dx = lo[0]; dx <= hi[0]; ++dx) {
      for (int dy = lo[1]; dy <= hi[1]; ++dy) {
        // Rows on the shell's faces take every z; interior columns only
        // their two end cells.
        if (dx == -r || dx == r || dy == -r || dy == r) {
          for (int dz = lo[2]; dz <= hi[2]; ++dz) {
            nbr_visit(q, pts, grid, nbr_cell(q.b, q.cell.x + dx, q.cell.y + dy, q.cell.z + dz, p), heap, m, want, p);
          }
        } else {
          if (-r >= lo[2]) {
            nbr_visit(q, pts, grid, nbr_cell(q.b, q.cell.x + dx, q.cell.y + dy, q.cell.z - r, p), heap, m, want, p);
          }
          if (r <= hi[2]) {
            nbr_visit(q, pts, grid, nbr_cell(q.b, q.cell.x + dx, q.cell.y + dy, q.cell.z + r, p), heap, m, want, p);
          }
        }
      }
    }
    if (m == want && r >= 2) {
      const float bound = float(r - 1) * p.cell;
      const float last = p.exact != 0 ? float(nbr_d2_exact(q, pts, heap[0]))
                                       : nbr_d2_float(q, pts, heap[0]);
      if (last < bound * bound) {
        break;
      }
    }
  }
  nbr_sort(q, pts, heap, want, p);
  for (int t = 0; t < want; ++t) {
    distances[base + t] = nbr_distance(q, pts, heap[t], p);
  }
}

// --------------------------------------------------------------- radius

// The cells a radius query must visit along axis a: those of [x - r,
// x + r], one more each side for rounding.
inline int2 nbr_span(float x, constant NeighborParams& p, int a) {
  const float r = p.radius * 1.0001f;
  return int2(max(nbr_axis(x - r, p, a) - 1, 0), min(nbr_axis(x + r, p, a) + 1, p.dims[a] - 1));
}

// Count: offsets[i + 1] = points within the radius (at most k when k > 0).
[[kernel]] void nbr_radius_count(
    device const float* qs [[buffer(0)]],
    device const int* qbatch [[buffer(1)]],
    device const float* pts [[buffer(2)]],
    device const int* grid [[buffer(3)]],
    device int* offsets [[buffer(4)]],
    constant NeighborParams& p [[buffer(5)]],
    uint i [[thread_position_in_grid]]) {
  if (i == 0) {
    offsets[0] = 0;
  }
  if (int(i) >= p.n_query) {
    return;
  }
  const NbrQuery q = nbr_query(qs, qbatch, int(i), p);
  int count = 0;
  if (q.b >= 0 && q.b < p.n_batch) {
    device const int* order = grid + p.n_cells + 2;
    const int2 sx = nbr_span(q.q.x, p, 0), sy = nbr_span(q.q.y, p, 1), sz = nbr_span(q.q.z, p, 2);
    for (int x = sx.x; x <= sx.y; ++x) {
      for (int y = sy.x; y <= sy.y; ++y) {
        for (int z = sz.x; z <= sz.y; ++z) {
          const int c = nbr_cell(q.b, x, y, z, p);
          for (int s = grid[c + 1]; s < grid[c + 2]; ++s) {
            count += nbr_within(q, pts, order[s], p) ? 1 : 0;
          }
        }
      }
    }
  }
  offsets[i + 1] = p.k > 0 ? min(count, p.k) : count;
}

// Fill: indices and distances as nbr_knn_fill's, the nearest
// offsets[i + 1] - offsets[i] points within the radius.
[[kernel]] void nbr_radius_fill(
    device const float* qs [[buffer(0)]],
    device const int* qbatch [[buffer(1)]],
    device const float* pts [[buffer(2)]],
    device const int* grid [[buffer(3)]],
    device const int* offsets [[buffer(4)]],
    device int* indices [[buffer(5)]],
    device float* distances [[buffer(6)]],
    constant NeighborParams& p [[buffer(7)]],
    uint i [[thread_position_in_grid]]) {
  if (int(i) >= p.n_query) {
    return;
  }
  const int base = offsets[i];
  const int want = offsets[i + 1] - base;
  if (want == 0) {
    return;
  }
  const NbrQuery q = nbr_query(qs, qbatch, int(i), p);
  device const int* order = grid + p.n_cells + 2;
  device int* heap = indices + base;
  int m = 0;
  const int2 sx = nbr_span(q.q.x, p, 0), sy = nbr_span(q.q.y, p, 1), sz = nbr_span(q.q.z, p, 2);
  for (int x = sx.x; x <= sx.y; ++x) {
    for (int y = sy.x; y <= sy.y; ++y) {
      for (int z = sz.x; z <= sz.y; ++z) {
        const int c = nbr_cell(q.b, x, y, z, p);
        for (int s = grid[c + 1]; s < grid[c + 2]; ++s) {
          const int j = order[s];
          if (nbr_within(q, pts, j, p)) {
            nbr_offer(q, pts, j, heap, m, want, p);
          }
        }
      }
    }
  }
  nbr_sort(q, pts, heap, want, p);
  for (int t = 0; t < want; ++t) {
    distances[base + t] = nbr_distance(q, pts, heap[t], p);
  }
}
