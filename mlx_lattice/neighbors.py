"""Neighbour queries between point or voxel sets and reductions over them.

:func:`knn` and :func:`radius` relate each query point to reference points
of the same batch item (never across items) and return a
:class:`NeighborRelation`: CSR offsets over the queries, neighbour indices
into the reference set and Euclidean distances, each query's neighbours
sorted by (distance, index). :func:`neighbor_reduce` gathers reference
features along a relation and sums, averages or takes the maximum per query,
optionally weighted per edge (point convolution / KPConv-style aggregation);
it is differentiable in the features and the weights.

A point set is an ``(N, 3)`` float array with an optional ``(N,)`` integer
batch index (default: all in item 0), an ``(N, 4)`` integer ``(batch, x, y,
z)`` coordinate array, or a :class:`SparseTensor` (its voxel coordinates, in
its own grid units).

Each query is a route of the registry (:mod:`mlx_lattice.routes`, passes
``knn`` and ``radius``), selected and recorded like a convolution's: the C++
CPU search (``cpu.knn`` / ``cpu.radius``, src/cpu/neighbors.cpp) on the CPU;
with a CUDA GPU as the default device ``cuda.knn`` / ``cuda.radius`` (the
same arrays); with a Mac's GPU ``metal.knn`` / ``metal.radius``
(metal/neighbors.metal). A query outside a GPU route's predicate runs on the
CPU, and the route log says why.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import mlx.core as mx

from . import _ext, backends, routes
from ._args import FLOAT_DTYPES, INT_DTYPES
from ._segment import accumulation_dtype, segment_max, segment_sum
from .tensor import SparseTensor

__all__ = ["NeighborRelation", "knn", "radius", "neighbor_reduce"]

REDUCTIONS = ("sum", "mean", "max")


class NeighborRelation(NamedTuple):
    """Query-major CSR relation: query ``i``'s neighbours are
    ``indices[offsets[i]:offsets[i + 1]]`` at ``distances[...]``."""

    offsets: mx.array  # (M + 1,) int32
    indices: mx.array  # (E,) int32, rows of the reference set
    distances: mx.array  # (E,) float32

    @property
    def num_queries(self) -> int:
        return self.offsets.shape[0] - 1

    @property
    def num_edges(self) -> int:
        return self.indices.shape[0]

    @property
    def counts(self) -> mx.array:
        """Neighbours per query, (M,) int32."""
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def rows(self) -> mx.array:
        """The query of each edge, (E,) int32."""
        counts = np.diff(np.array(self.offsets))
        return mx.array(np.repeat(np.arange(len(counts), dtype=np.int32), counts))


def _int_array(v, name):
    a = v if isinstance(v, mx.array) else mx.array(np.asarray(v))
    if a.dtype not in INT_DTYPES:
        raise TypeError(f"{name} must hold integers, got {a.dtype}")
    return a


def _point_set(x, batch, name):
    """(N, 3) float32 positions and (N,) int32 batch indices, as arrays and
    as NumPy (which the route's context reads)."""
    if isinstance(x, SparseTensor):
        if batch is not None:
            raise ValueError(f"{name}_batch must be None when {name} is a SparseTensor (its coords hold the batch)")
        x = x.coords
    if not isinstance(x, mx.array):
        try:
            x = mx.array(np.asarray(x))
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be an (N, 3) float or (N, 4) integer array, got {type(x).__name__}") from None
    if x.ndim == 2 and x.shape[1] == 4 and x.dtype in INT_DTYPES:
        if batch is not None:
            raise ValueError(f"{name}_batch must be None when {name} is (N, 4) (batch, x, y, z) coordinates")
        c = x.astype(mx.int32)
        b, pts = c[:, 0], c[:, 1:].astype(mx.float32)
    elif x.ndim == 2 and x.shape[1] == 3 and x.dtype in FLOAT_DTYPES + (mx.float64,):
        pts = x.astype(mx.float32)
        n = x.shape[0]
        if batch is None:
            b = mx.zeros((n,), dtype=mx.int32)
        else:
            b = _int_array(batch, f"{name}_batch")
            if b.ndim != 1 or b.shape[0] != n:
                raise ValueError(f"{name}_batch must have shape ({n},), got {tuple(b.shape)}")
            b = b.astype(mx.int32)
    else:
        raise ValueError(
            f"{name} must be an (N, 3) float or (N, 4) integer array, got {x.dtype} of shape {tuple(x.shape)}"
        )
    bn = np.array(b)
    if bn.size and bn.min() < 0:
        raise ValueError(f"{name} batch indices must be >= 0, got {int(bn.min())}")
    pn = np.array(pts)
    if not np.isfinite(pn).all():
        raise ValueError(f"{name} must be finite")
    pn, bn = np.ascontiguousarray(pn), np.ascontiguousarray(bn)
    return mx.array(pn), mx.array(bn), pn, bn


def _backend():
    """(the backend a query runs on now, why it left its GPU or None)."""
    return backends.executing()


def _query(op: str, queries, points, k: int, r: float) -> NeighborRelation:
    """Select, record and run the route of one query: ``k`` neighbours wanted
    (radius: at most, 0 for all) within ``r`` (0: k nearest)."""
    q, qb, qn, _ = queries
    p, pb, pn, pbn = points
    n = pn.shape[0]
    # Neither changes the result: an item never yields more than its points.
    k = min(k, max(n, 1))
    backend, unusable = _backend()
    ctx = routes.context(
        op, backend.name, direction=op, map_kind="neighbors", dtype="float32", kernel_size=None,
        n_in=n, n_out=qn.shape[0], k=k, radius=float(r), batches=int(pbn.max()) + 1 if n else 0,
        coord_max=float(max(np.abs(qn).max(initial=0.0), np.abs(pn).max(initial=0.0))),
    )
    route = routes.choose(ctx, fallback=unusable).route
    run = backends.get(route.backend).neighbor_queries()
    if op == "knn":
        out = (run.knn if run else _ext.knn_query)(q, qb, p, pb, k)
    else:
        out = (run.radius if run else _ext.radius_query)(q, qb, p, pb, float(r), k)
    return NeighborRelation(*out)


def knn(queries, points, k: int, *, query_batch=None, point_batch=None) -> NeighborRelation:
    """The ``k`` nearest ``points`` of each query (of its batch item).

    A query whose item holds fewer than ``k`` points gets all of them; one
    whose item holds none gets no neighbour. Ties in distance go to the lower
    point index.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    q = _point_set(queries, query_batch, "queries")
    p = _point_set(points, point_batch, "points")
    return _query("knn", q, p, int(k), 0.0)


def radius(queries, points, r: float, *, query_batch=None, point_batch=None,
           max_neighbors: int | None = None) -> NeighborRelation:
    """Every point within distance ``r`` (inclusive) of each query, of its
    batch item; with ``max_neighbors`` only the nearest that many."""
    if isinstance(r, bool) or not isinstance(r, (int, float, np.integer, np.floating)) or not (
        np.isfinite(r) and r > 0
    ):
        raise ValueError(f"r must be a positive finite number, got {r!r}")
    if max_neighbors is not None and (
        isinstance(max_neighbors, bool) or not isinstance(max_neighbors, (int, np.integer)) or max_neighbors < 1
    ):
        raise ValueError(f"max_neighbors must be None or a positive int, got {max_neighbors!r}")
    q = _point_set(queries, query_batch, "queries")
    p = _point_set(points, point_batch, "points")
    return _query("radius", q, p, int(max_neighbors or 0), float(r))


def neighbor_reduce(feats, relation: NeighborRelation, weights=None, reduce: str = "sum"):
    """``out[i] = reduce over edges e of query i of weights[e] * feats[indices[e]]``.

    ``feats``: ``(N, C)`` features of the reference points (or a
    SparseTensor, whose features are used). ``weights``: optional ``(E,)`` or
    ``(E, C)`` per-edge weights. ``reduce``: ``"sum"``, ``"mean"`` (over the
    query's edges) or ``"max"`` (per channel; ties go to the query's first,
    i.e. nearest, edge, which alone receives the gradient). Queries without
    neighbours give 0. Sums accumulate in float32; the result has the
    features' dtype, shape ``(M, C)``. Differentiable in ``feats`` and
    ``weights``.
    """
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
    if not isinstance(relation, NeighborRelation):
        raise TypeError(f"relation must be a NeighborRelation, got {type(relation).__name__}")
    if isinstance(feats, SparseTensor):
        feats = feats.feats
    if not isinstance(feats, mx.array) or feats.ndim != 2 or feats.dtype not in FLOAT_DTYPES:
        raise ValueError(
            "feats must be an (N, C) float32/float16/bfloat16 mx.array, got "
            + (f"{feats.dtype} {tuple(feats.shape)}" if isinstance(feats, mx.array) else type(feats).__name__)
        )
    m, e = relation.num_queries, relation.num_edges
    n, c = feats.shape
    if e and int(mx.max(relation.indices).item()) >= n:
        raise ValueError(f"relation indexes {int(mx.max(relation.indices).item()) + 1} points, feats has {n} rows")
    vals = feats[relation.indices] if e else mx.zeros((0, c), dtype=feats.dtype)
    if weights is not None:
        if not isinstance(weights, mx.array) or weights.dtype not in FLOAT_DTYPES:
            raise ValueError("weights must be a float mx.array")
        if weights.shape not in ((e,), (e, c)):
            raise ValueError(f"weights must have shape ({e},) or ({e}, {c}), got {tuple(weights.shape)}")
        w = weights[:, None] if weights.ndim == 1 else weights
        vals = vals.astype(accumulation_dtype(feats.dtype)) * w.astype(accumulation_dtype(feats.dtype))
    rows = relation.rows
    if reduce == "max":
        counts = np.diff(np.array(relation.offsets))
        return segment_max(vals.astype(feats.dtype), rows, m, nonempty=counts > 0)
    out = segment_sum(vals, rows, m)
    if reduce == "mean":
        counts = np.diff(np.array(relation.offsets)).astype(np.float32)
        out = out * mx.array(1.0 / np.maximum(counts, 1.0))[:, None]
    return out.astype(feats.dtype)
