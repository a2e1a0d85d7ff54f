"""Neighbour queries on a Metal GPU (routes ``metal.knn`` and
``metal.radius``): the programs of src/metal/neighbors.cpp, each step an
array of the ``MetalNeighborStep`` primitive (``_ext.metal_neighbor_step``)
whose ``eval_gpu`` encodes the step's program.

The host computes the query's parameters once (``_ext.metal_neighbor_params``:
the grid over the points' bounding box, and whether every coordinate is an
integer, which makes squared distances exact 64-bit integers); then the
grid, the count (CSR offsets) and the fill (indices and distances) run on
the GPU, with one synchronisation between count and fill: the edge count.
Empty query or point sets need no kernel. ``SYNCS`` counts the
synchronisations.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ... import _ext

SYNCS = 0  # host synchronisations of neighbour queries so far
_INT32_MAX = int(np.iinfo(np.int32).max)


def _run(route: str, step: str, inputs: list, params, edges: int = 0) -> list:
    """One step's outputs on the default stream."""
    return _ext.metal_neighbor_step(route, step, inputs, params, edges)


def _too_many_edges(offsets: np.ndarray) -> ValueError:
    """The CPU's error for a relation past int32 offsets. The GPU's scan adds
    in int32 and wraps; each count is below 2^28, so the first running sum
    past 2^31 - 1 reads negative, and the counts are the differences mod 2^32."""
    total = int((np.diff(offsets.astype(np.int64)) % 2**32).sum())
    return ValueError(
        f"the relation would hold {total} edges, more than int32 offsets address; "
        "use a smaller radius or max_neighbors"
    )


def _query(route: str, q: mx.array, qb: mx.array, p: mx.array, pb: mx.array, k: int, radius: float):
    global SYNCS
    nq, n = q.shape[0], p.shape[0]
    if nq == 0 or n == 0:  # no query, or nothing to find: no edge
        return mx.zeros((nq + 1,), mx.int32), mx.zeros((0,), mx.int32), mx.zeros((0,), mx.float32)
    params = _ext.metal_neighbor_params(q, qb, p, pb, k, radius)
    inputs = [q, qb, p, pb]
    (grid,) = _run(route, "grid", inputs, params)
    (offsets,) = _run(route, "count", inputs + [grid], params)
    lowest = mx.min(offsets)
    mx.eval(offsets, lowest)  # the one synchronisation: the edge count
    SYNCS += 1
    if lowest.item() < 0:
        raise _too_many_edges(np.array(offsets))
    edges = int(offsets[-1].item())
    if edges == 0:
        return offsets, mx.zeros((0,), mx.int32), mx.zeros((0,), mx.float32)
    indices, distances = _run(route, "fill", inputs + [grid, offsets], params, edges)
    return offsets, indices, distances


def knn(q: mx.array, qb: mx.array, p: mx.array, pb: mx.array, k: int):
    """``_ext.knn_query`` on the GPU: (offsets, indices, distances)."""
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    return _query("metal.knn", q, qb, p, pb, int(min(k, _INT32_MAX)), 0.0)


def radius(q: mx.array, qb: mx.array, p: mx.array, pb: mx.array, r: float, max_neighbors: int = 0):
    """``_ext.radius_query`` on the GPU: (offsets, indices, distances)."""
    if not (np.isfinite(r) and r > 0):
        raise ValueError(f"radius must be positive and finite, got {r}")
    if max_neighbors < 0:
        raise ValueError(f"max_neighbors must be >= 0, got {max_neighbors}")
    return _query("metal.radius", q, qb, p, pb, int(min(max_neighbors, _INT32_MAX)), float(r))
