"""Voxel helpers on (N, 4) int32 ``(batch, x, y, z)`` coordinates: points to
voxels (through :func:`mlx_lattice.points.sparse_quantize`), how connected a
voxel set is, and uniform random voxels.
"""

from __future__ import annotations

import numpy as np

from ..points import sparse_quantize

__all__ = ["voxelize_points", "neighbour_counts", "neighbour_stats", "uniform_random"]

_MAX_KEY = np.iinfo(np.int64).max


def _radix(lo, hi):
    """Mixed-radix bases for values in [lo, hi] per column, or None on overflow."""
    spans = [int(h) - int(l) + 1 for l, h in zip(lo, hi)]
    total = 1
    for s in spans:
        total *= s
    if total > _MAX_KEY:
        return None
    return spans


def _pack(values, lo, spans):
    key = np.zeros(len(values), dtype=np.int64)
    for k, s in enumerate(spans):
        key = key * s + (values[:, k].astype(np.int64) - int(lo[k]))
    return key


def _unpack(key, lo, spans):
    out = np.empty((len(key), len(spans)), dtype=np.int64)
    rest = key.copy()
    for k in range(len(spans) - 1, -1, -1):
        rest, out[:, k] = np.divmod(rest, spans[k])
        out[:, k] += int(lo[k])
    return out


def _with_batch(q, batch):
    out = np.empty((len(q), 4), dtype=np.int32)
    out[:, 0] = batch
    out[:, 1:] = q
    return out


def voxelize_points(points, voxel_size, batch=0):
    """Unique voxels ``floor(points / voxel_size)`` as (N, 4) int32 rows.

    Rows are ``(batch, x, y, z)``, sorted lexicographically.  Only the first
    three columns of ``points`` are used.
    """
    return sparse_quantize(points, voxel_size, batch=batch)


_OFFSETS26 = np.array(
    [(i, j, k) for i in (-1, 0, 1) for j in (-1, 0, 1) for k in (-1, 0, 1) if (i, j, k) != (0, 0, 0)],
    dtype=np.int64,
)


def neighbour_counts(coords):
    """Per voxel, how many of its 26 neighbours (same batch) are occupied.

    ``coords`` is (N, 4) ``(batch, x, y, z)`` or (N, 3) ``(x, y, z)``; rows
    are assumed unique.
    """
    c = np.asarray(coords, dtype=np.int64)
    if c.ndim != 2 or c.shape[1] not in (3, 4):
        raise ValueError("coords must have shape (N, 3) or (N, 4)")
    n = len(c)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    if c.shape[1] == 3:
        c = np.concatenate([np.zeros((n, 1), dtype=np.int64), c], axis=1)
    lo = c.min(axis=0)
    hi = c.max(axis=0)
    lo[1:] -= 1  # room for the -1 / +1 offsets
    hi[1:] += 1
    spans = _radix(lo, hi)
    counts = np.zeros(n, dtype=np.int32)
    if spans is None:  # astronomically sparse coordinates: hash rows instead
        table = {tuple(r) for r in c.tolist()}
        for off in _OFFSETS26:
            shifted = c.copy()
            shifted[:, 1:] += off
            counts += np.fromiter((tuple(r) in table for r in shifted.tolist()), bool, n)
        return counts
    key = _pack(c, lo, spans)
    order = np.sort(key)
    strides = np.array([spans[2] * spans[3], spans[3], 1], dtype=np.int64)
    for off in _OFFSETS26:
        q = key + int(off @ strides)
        idx = np.searchsorted(order, q)
        np.minimum(idx, n - 1, out=idx)
        counts += order[idx] == q
    return counts


def neighbour_stats(coords):
    """Mean number of occupied neighbours (out of 26) per voxel."""
    counts = neighbour_counts(coords)
    return float(counts.mean()) if len(counts) else 0.0


def uniform_random(n, extent, seed=0, batch=0):
    """``n`` distinct random voxels in the cube ``[0, extent)^3``, sorted."""
    n, extent = int(n), int(extent)
    total = extent**3
    if n < 0 or n > total:
        raise ValueError(f"cannot draw {n} distinct voxels from a cube of {total}")
    rng = np.random.default_rng(seed)
    lin = np.sort(rng.choice(total, size=n, replace=False).astype(np.int64))
    x, rest = np.divmod(lin, extent * extent)
    y, z = np.divmod(rest, extent)
    return _with_batch(np.stack([x, y, z], axis=1), batch)
