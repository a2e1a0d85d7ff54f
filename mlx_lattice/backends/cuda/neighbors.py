"""Neighbour queries on CUDA: k nearest and fixed radius as
``mx.fast.cuda_kernel`` sources, the algorithm of metal/neighbors.metal.

Reference points are bucketed in a dense grid of cells per batch item (the
grid of ``_ext.neighbor_grid``, the Metal programs' own): a counting pass,
a scan (``mx.cumsum``) and a fill. Each query then keeps a bounded
insertion list of point indices in its slice of the output, sorted by
(squared distance, index): k nearest over shells of cells of growing
radius, radius queries over the cells of their box (count, then fill).
Squared distances are float64 with the CPU's operation order and no
contraction (``__dmul_rn``/``__dadd_rn``), so offsets, indices and
distances equal the CPU's (src/cpu/neighbors.cpp) element for element, ties and
the inclusive radius boundary included. One host synchronisation per query:
the edge count, between count and fill.
"""

from __future__ import annotations

import numpy as np
import mlx.core as mx

from ... import _ext
from . import jit

# ip: n_query, n_points, n_batch, dims[3], n_cells, k, radius bits (lo, hi)
# fp: origin[3], inv_cell, cell
COMMON = """
struct NbrGrid {
  int n_query, n_points, n_batch, dims[3], n_cells, k;
  double origin[3], inv_cell, cell, r2;
};

__device__ inline NbrGrid nbr_grid(const int* ip, const float* fp) {
  NbrGrid g;
  g.n_query = ip[0];
  g.n_points = ip[1];
  g.n_batch = ip[2];
  for (int a = 0; a < 3; ++a) {
    g.dims[a] = ip[3 + a];
    g.origin[a] = (double)fp[a];
  }
  g.n_cells = ip[6];
  g.k = ip[7];
  const double r = __hiloint2double(ip[9], ip[8]);
  g.r2 = __dmul_rn(r, r);
  g.inv_cell = (double)fp[3];
  g.cell = (double)fp[4];
  return g;
}

// Cell along axis a: monotone in x, clamped to the grid.
__device__ inline int nbr_axis(double x, const NbrGrid& g, int a) {
  const double t = floor((x - g.origin[a]) * g.inv_cell);
  return (int)fmin(fmax(t, 0.0), (double)(g.dims[a] - 1));
}

__device__ inline int nbr_cell(int b, int x, int y, int z, const NbrGrid& g) {
  return ((b * g.dims[0] + x) * g.dims[1] + y) * g.dims[2] + z;
}

__device__ inline int nbr_point_cell(const float* pts, int i, int b, const NbrGrid& g) {
  const float* v = pts + 3 * (long)i;
  return nbr_cell(b, nbr_axis(v[0], g, 0), nbr_axis(v[1], g, 1), nbr_axis(v[2], g, 2), g);
}

// The CPU's squared distance: ((dx * dx + dy * dy) + dz * dz) in double.
__device__ inline double nbr_d2(const float* q, const float* pts, int j) {
  const float* r = pts + 3 * (long)j;
  const double dx = __dsub_rn((double)q[0], (double)r[0]);
  const double dy = __dsub_rn((double)q[1], (double)r[1]);
  const double dz = __dsub_rn((double)q[2], (double)r[2]);
  return __dadd_rn(__dadd_rn(__dmul_rn(dx, dx), __dmul_rn(dy, dy)), __dmul_rn(dz, dz));
}

__device__ inline bool nbr_less(const float* q, const float* pts, int a, int b) {
  const double da = nbr_d2(q, pts, a), db = nbr_d2(q, pts, b);
  return da < db || (da == db && a < b);
}

// Offers point j to the sorted list[0 .. *m) of capacity want.
__device__ inline void nbr_offer(const float* q, const float* pts, int j, int* list, int* m, int want) {
  int pos;
  if (*m < want) {
    pos = (*m)++;
  } else if (nbr_less(q, pts, j, list[want - 1])) {
    pos = want - 1;
  } else {
    return;
  }
  while (pos > 0 && nbr_less(q, pts, j, list[pos - 1])) {
    list[pos] = list[pos - 1];
    --pos;
  }
  list[pos] = j;
}

__device__ inline void nbr_visit(
    const float* q, const float* pts, const int* cells, const int* order, int c,
    int* list, int* m, int want) {
  for (int s = cells[c]; s < cells[c + 1]; ++s) nbr_offer(q, pts, order[s], list, m, want);
}

// Cells a radius query visits along axis a: those of [x - r, x + r] and
// one more each side.
__device__ inline void nbr_span(double x, const NbrGrid& g, int a, int* lo, int* hi) {
  const double r = sqrt(g.r2) * 1.0001;
  *lo = max(nbr_axis(x - r, g, a) - 1, 0);
  *hi = min(nbr_axis(x + r, g, a) + 1, g.dims[a] - 1);
}
"""

# One thread per point: counts[c + 1] += 1 for its cell c.
COUNT_SOURCE = """
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const NbrGrid g = nbr_grid(ip, fp);
  if (i >= g.n_points) return;
  atomicAdd(&counts[nbr_point_cell(pts, i, batch[i], g) + 1], 1);
"""
# One thread per point: its slot in its cell (cells: starts, from the scan).
# The order within a cell depends on the schedule; no result does.
FILL_SOURCE = """
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const NbrGrid g = nbr_grid(ip, fp);
  if (i >= g.n_points) return;
  const int c = nbr_point_cell(pts, i, batch[i], g);
  order[cells[c] + atomicAdd(&cursor[c], 1)] = i;
"""
# One thread per query: min(k, points of its item).
KNN_COUNT_SOURCE = """
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const NbrGrid g = nbr_grid(ip, fp);
  if (i >= g.n_query) return;
  const int b = qbatch[i];
  const int per = g.dims[0] * g.dims[1] * g.dims[2];
  const int have = (b >= 0 && b < g.n_batch) ? cells[(b + 1) * per] - cells[b * per] : 0;
  counts[i] = min(g.k, have);
"""
# One thread per query: shells of cells of growing Chebyshev radius r;
# after shell r every unvisited point lies at least (r - 1) cells away
# (a cell of slack for rounding), where the search stops once the list is
# full and its last squared distance is below that.
KNN_FILL_SOURCE = """
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const NbrGrid g = nbr_grid(ip, fp);
  if (i >= g.n_query) return;
  const int base = offsets[i];
  const int want = offsets[i + 1] - base;
  if (want == 0) return;
  const float* q = qs + 3 * (long)i;
  const int b = qbatch[i];
  int cq[3], reach = 0;
  for (int a = 0; a < 3; ++a) {
    cq[a] = nbr_axis(q[a], g, a);
    reach = max(reach, max(cq[a], g.dims[a] - 1 - cq[a]));
  }
  int* list = indices + base;
  int m = 0;
  for (int r = 0; r <= reach; ++r) {
    int lo[3], hi[3];
    for (int a = 0; a < 3; ++a) {
      lo[a] = max(-r, -cq[a]);
      hi[a] = min(r, g.dims[a] - 1 - cq[a]);
    }
    for (int dx = lo[0]; dx <= hi[0]; ++dx) {
      for (int dy = lo[1]; dy <= hi[1]; ++dy) {
        if (dx == -r || dx == r || dy == -r || dy == r) {
          for (int dz = lo[2]; dz <= hi[2]; ++dz) {
            nbr_visit(q, pts, cells, order, nbr_cell(b, cq[0] + dx, cq[1] + dy, cq[2] + dz, g), list, &m, want);
          }
        } else {
          if (-r >= lo[2]) {
            nbr_visit(q, pts, cells, order, nbr_cell(b, cq[0] + dx, cq[1] + dy, cq[2] - r, g), list, &m, want);
          }
          if (r <= hi[2]) {
            nbr_visit(q, pts, cells, order, nbr_cell(b, cq[0] + dx, cq[1] + dy, cq[2] + r, g), list, &m, want);
          }
        }
      }
    }
    if (m == want && r >= 2) {
      const double bound = (double)(r - 1) * g.cell;
      if (nbr_d2(q, pts, list[want - 1]) < bound * bound) break;
    }
  }
  for (int t = 0; t < want; ++t) {
    distances[base + t] = __double2float_rn(sqrt(nbr_d2(q, pts, list[t])));
  }
"""
# One thread per query: points within the radius (at most k when k > 0).
RADIUS_COUNT_SOURCE = """
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const NbrGrid g = nbr_grid(ip, fp);
  if (i >= g.n_query) return;
  const float* q = qs + 3 * (long)i;
  const int b = qbatch[i];
  int count = 0;
  if (b >= 0 && b < g.n_batch) {
    int lo[3], hi[3];
    for (int a = 0; a < 3; ++a) nbr_span(q[a], g, a, &lo[a], &hi[a]);
    for (int x = lo[0]; x <= hi[0]; ++x)
      for (int y = lo[1]; y <= hi[1]; ++y)
        for (int z = lo[2]; z <= hi[2]; ++z) {
          const int c = nbr_cell(b, x, y, z, g);
          for (int s = cells[c]; s < cells[c + 1]; ++s) count += nbr_d2(q, pts, order[s]) <= g.r2 ? 1 : 0;
        }
  }
  counts[i] = g.k > 0 ? min(count, g.k) : count;
"""
# One thread per query: the nearest offsets[i + 1] - offsets[i] points
# within the radius.
RADIUS_FILL_SOURCE = """
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const NbrGrid g = nbr_grid(ip, fp);
  if (i >= g.n_query) return;
  const int base = offsets[i];
  const int want = offsets[i + 1] - base;
  if (want == 0) return;
  const float* q = qs + 3 * (long)i;
  const int b = qbatch[i];
  int lo[3], hi[3];
  for (int a = 0; a < 3; ++a) nbr_span(q[a], g, a, &lo[a], &hi[a]);
  int* list = indices + base;
  int m = 0;
  for (int x = lo[0]; x <= hi[0]; ++x)
    for (int y = lo[1]; y <= hi[1]; ++y)
      for (int z = lo[2]; z <= hi[2]; ++z) {
        const int c = nbr_cell(b, x, y, z, g);
        for (int s = cells[c]; s < cells[c + 1]; ++s) {
          const int j = order[s];
          if (nbr_d2(q, pts, j) <= g.r2) nbr_offer(q, pts, j, list, &m, want);
        }
      }
  for (int t = 0; t < want; ++t) {
    distances[base + t] = __double2float_rn(sqrt(nbr_d2(q, pts, list[t])));
  }
"""

# name -> (inputs, outputs, body)
KERNELS = {
    "count": (["pts", "batch", "ip", "fp"], ["counts"], COUNT_SOURCE),
    "fill": (["pts", "batch", "cells", "ip", "fp"], ["order", "cursor"], FILL_SOURCE),
    "knn_count": (["qbatch", "cells", "ip", "fp"], ["counts"], KNN_COUNT_SOURCE),
    "knn_fill": (["qs", "qbatch", "pts", "cells", "order", "offsets", "ip", "fp"], ["indices", "distances"],
                 KNN_FILL_SOURCE),
    "radius_count": (["qs", "qbatch", "pts", "cells", "order", "ip", "fp"], ["counts"], RADIUS_COUNT_SOURCE),
    "radius_fill": (["qs", "qbatch", "pts", "cells", "order", "offsets", "ip", "fp"], ["indices", "distances"],
                    RADIUS_FILL_SOURCE),
}


_kernel = jit.Family("mlx_lattice_neighbors_", KERNELS, header=COMMON)
_launch = _kernel.launch


def _query(q, qb, p, pb, k: int, radius: float):
    """(offsets, indices, distances) with the CPU's arrays; k nearest when
    radius == 0, else within radius keeping at most k (0: all)."""
    nq, n = q.shape[0], p.shape[0]
    grid = _ext.neighbor_grid(q, qb, p, pb, k, radius)
    bits = np.array([radius], np.float64).view(np.int32)  # (lo, hi), little-endian
    ip = mx.array(np.array([nq, n, grid["n_batch"], *grid["dims"], grid["n_cells"], k, bits[0], bits[1]], np.int32))
    fp = mx.array(np.array([*grid["origin"], grid["inv_cell"], grid["cell"]], np.float32))
    nc = grid["n_cells"]
    counts = _launch("count", n, [p, pb, ip, fp], [(nc + 1,)], [mx.int32], init_value=0)[0]
    cells = mx.cumsum(counts)  # cells[c] .. cells[c + 1]: cell c's slots
    order, _ = _launch("fill", n, [p, pb, cells, ip, fp], [(max(n, 1),), (max(nc, 1),)], [mx.int32, mx.int32],
                       init_value=0)
    if radius == 0:
        per_query = _launch("knn_count", nq, [qb, cells, ip, fp], [(max(nq, 1),)], [mx.int32])[0]
    else:
        per_query = _launch("radius_count", nq, [q, qb, p, cells, order, ip, fp], [(max(nq, 1),)], [mx.int32])[0]
    offsets = mx.concatenate([mx.zeros((1,), mx.int32), mx.cumsum(per_query[:nq])])
    # the edge count summed in int64, where a count past int32 shows (the
    # int32 offsets would wrap)
    total = mx.sum(per_query[:nq].astype(mx.int64))
    mx.eval(offsets, total)  # the one synchronisation: the edge count
    edges = int(total.item())
    if edges > np.iinfo(np.int32).max:
        raise ValueError(f"the relation would hold {edges} edges, more than int32 offsets address")
    if edges == 0:
        return offsets, mx.zeros((0,), mx.int32), mx.zeros((0,), mx.float32)
    name = "knn_fill" if radius == 0 else "radius_fill"
    indices, distances = _launch(
        name, nq, [q, qb, p, cells, order, offsets, ip, fp], [(edges,), (edges,)], [mx.int32, mx.float32]
    )
    return offsets, indices, distances


def knn(q: mx.array, qb: mx.array, p: mx.array, pb: mx.array, k: int):
    """``_ext.knn_query`` on the GPU: the same (offsets, indices, distances)."""
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    return _query(q, qb, p, pb, int(k), 0.0)


def radius(q: mx.array, qb: mx.array, p: mx.array, pb: mx.array, r: float, max_neighbors: int = 0):
    """``_ext.radius_query`` on the GPU: the same (offsets, indices, distances)."""
    if not (np.isfinite(r) and r > 0):
        raise ValueError(f"radius must be positive and finite, got {r}")
    if max_neighbors < 0:
        raise ValueError(f"max_neighbors must be >= 0, got {max_neighbors}")
    return _query(q, qb, p, pb, int(max_neighbors), float(r))
