"""Points to voxels and back.

A point ``p`` (world units) falls in voxel ``floor(p / voxel_size)``,
computed in float64; voxel ``v`` covers ``[v, v + 1) * voxel_size`` and its
centre is ``(v + 0.5) * voxel_size``. A tensor of stride ``s`` has cells
``s * voxel_size`` wide.

- :func:`sparse_quantize`: the unique voxels of a point set (NumPy, no
  gradients), optionally with each voxel's first point and each point's voxel.
- :func:`voxelize`: a :class:`SparseTensor` whose features reduce the point
  features of each voxel (mean, sum or max), differentiable in the features.
- :func:`devoxelize`: voxel features read back at points (nearest voxel or
  trilinear interpolation between voxel centres), differentiable in the
  voxel features.
"""

from __future__ import annotations

import numpy as np
import mlx.core as mx

from . import _ext
from ._args import as_feats
from ._segment import segment_max, segment_sum
from .tensor import SparseTensor

__all__ = ["sparse_quantize", "voxelize", "devoxelize"]

_REDUCTIONS = ("mean", "sum", "max")
_MODES = ("nearest", "trilinear")


def _voxel_size(voxel_size) -> np.ndarray:
    vs = np.asarray(voxel_size, dtype=np.float64)
    if vs.ndim == 0:
        vs = np.repeat(vs, 3)
    if vs.shape != (3,) or not np.all(np.isfinite(vs)) or np.any(vs <= 0):
        raise ValueError(f"voxel_size must be a positive number or 3 positive numbers, got {voxel_size!r}")
    return vs


def _points(points, name="points") -> np.ndarray:
    p = np.asarray(points.astype(mx.float32) if isinstance(points, mx.array) else points)
    if p.ndim != 2 or p.shape[1] < 3:
        raise ValueError(f"{name} must have shape (N, 3) (extra columns are ignored), got {p.shape}")
    p = p[:, :3].astype(np.float64)
    if not np.all(np.isfinite(p)):
        raise ValueError(f"{name} must be finite")
    return p


def _batch(batch, n) -> np.ndarray:
    if batch is None:
        return np.zeros(n, dtype=np.int64)
    b = np.asarray(batch)
    if b.ndim == 0:
        b = np.full(n, int(b))
    if b.shape != (n,) or not np.issubdtype(b.dtype, np.integer):
        raise ValueError(f"batch must be an int or ({n},) integers, got {b.dtype} {b.shape}")
    b = b.astype(np.int64)
    if n and (b.min() < 0 or b.max() >= _ext.BATCH_LIMIT):
        raise ValueError(f"batch indices must lie in [0, {_ext.BATCH_LIMIT})")
    return b


def _check_range(q: np.ndarray):
    if q.size and (q.min() < _ext.COORD_MIN or q.max() > _ext.COORD_MAX):
        raise ValueError(
            f"voxel coordinates span [{int(q.min())}, {int(q.max())}], outside "
            f"[{_ext.COORD_MIN}, {_ext.COORD_MAX}]; use a larger voxel_size"
        )


def _pack(b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(batch, x, y, z) -> int64 keys whose order is the lexicographic order."""
    off = -_ext.COORD_MIN
    span = _ext.COORD_MAX - _ext.COORD_MIN + 1
    key = b.astype(np.int64)
    for a in range(3):
        key = key * span + (q[:, a] + off)
    return key


def _unpack(key: np.ndarray) -> np.ndarray:
    off = -_ext.COORD_MIN
    span = _ext.COORD_MAX - _ext.COORD_MIN + 1
    out = np.empty((len(key), 4), dtype=np.int32)
    rest = key.copy()
    for a in (3, 2, 1):
        rest, r = np.divmod(rest, span)
        out[:, a] = r - off
    out[:, 0] = rest
    return out


def sparse_quantize(points, voxel_size=1.0, *, batch=None, return_index=False, return_inverse=False):
    """Unique voxels ``(batch, floor(points / voxel_size))`` of a point set.

    points: (N, 3+) floats (NumPy or MLX; extra columns ignored).
    voxel_size: a positive number or one per axis.
    batch: None (all batch 0), an int, or (N,) batch indices.

    Returns ``coords`` (M, 4) int32 rows ``(batch, x, y, z)``, unique and
    sorted; with ``return_index`` also ``index`` (M,) int64, the first (lowest)
    point index in each voxel; with ``return_inverse`` also ``inverse`` (N,)
    int64, each point's row in ``coords``.
    """
    p = _points(points)
    vs = _voxel_size(voxel_size)
    b = _batch(batch, len(p))
    q = np.floor(p / vs).astype(np.int64) if len(p) else np.zeros((0, 3), np.int64)
    _check_range(q)
    keys, index, inverse = np.unique(_pack(b, q), return_index=True, return_inverse=True)
    coords = _unpack(keys)
    out = [coords]
    if return_index:
        out.append(index.astype(np.int64))
    if return_inverse:
        out.append(inverse.reshape(-1).astype(np.int64))
    return out[0] if len(out) == 1 else tuple(out)


def voxelize(points, feats, voxel_size, batch=None, reduce="mean", *, manager=None):
    """Average (or sum, or max) point features into the voxels they fall in.

    points: (N, 3+) positions in world units; feats: (N, C) point features
    (MLX or NumPy; float32/float16/bfloat16), differentiable; batch: None, an
    int, or (N,) batch indices. ``reduce='max'`` takes each channel's maximum
    over the voxel's points; ties go to the lowest point index, which alone
    receives the gradient.

    Returns ``(x, point_to_voxel)``: ``x`` a :class:`SparseTensor` with rows
    sorted by ``(batch, x, y, z)`` (stride 1) and ``point_to_voxel`` (N,) int32,
    each point's row in ``x`` (so ``x.feats[point_to_voxel]`` reads voxel
    features back at the points).
    """
    if reduce not in _REDUCTIONS:
        raise ValueError(f"reduce must be one of {_REDUCTIONS}, got {reduce!r}")
    coords, inverse = sparse_quantize(points, voxel_size, batch=batch, return_inverse=True)
    f = as_feats(feats, inverse.shape[0])
    n_vox = len(coords)
    seg = mx.array(inverse.astype(np.int32))
    if reduce == "max":
        y = segment_max(f, seg, n_vox, nonempty=np.ones(n_vox, dtype=bool))
    else:
        y = segment_sum(f, seg, n_vox)
        if reduce == "mean":
            counts = np.bincount(inverse, minlength=n_vox).astype(np.float32)
            y = y / mx.array(counts)[:, None]
        y = y.astype(f.dtype)
    x = SparseTensor(mx.array(coords), y, manager=manager)
    return x, seg


def _cell(x: SparseTensor, voxel_size) -> np.ndarray:
    return _voxel_size(voxel_size) * np.asarray(x.stride, dtype=np.float64)


def devoxelize(x: SparseTensor, points, voxel_size, batch=None, mode="nearest") -> mx.array:
    """Voxel features read back at points: ``(N, C)`` in ``x``'s dtype.

    ``voxel_size`` is the finest grid's voxel size (the one given to
    :func:`voxelize`); the tensor's stride scales it.

    - ``nearest``: the features of the voxel containing the point (its centre
      is the nearest voxel centre), zeros where that voxel is not active.
    - ``trilinear``: trilinear interpolation between the 8 voxel centres around
      the point. Weights of inactive corners are dropped and the rest
      renormalised to sum to 1; a point with no active corner gets zeros.

    Gradients flow to ``x.feats`` (not to the point positions).
    """
    if not isinstance(x, SparseTensor):
        raise TypeError(f"devoxelize: x must be a SparseTensor, got {type(x).__name__}")
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    p = _points(points)
    b = _batch(batch, len(p))
    cell = _cell(x, voxel_size)
    n, c = len(p), x.feats.shape[1]
    if n == 0:
        return mx.zeros((0, c), dtype=x.dtype)
    table = x.coordinate_set.table
    padded = mx.concatenate([x.feats, mx.zeros((1, c), dtype=x.dtype)], axis=0)
    empty_row = len(x)

    def lookup(q):  # (M, 3) int64 voxel coords -> rows, empty_row where inactive
        lim = (_ext.COORD_MIN - 1, _ext.COORD_MAX + 1)  # outside the range: never active
        rows = np.empty((len(q), 4), dtype=np.int32)
        rows[:, 0] = np.repeat(b, len(q) // n)
        rows[:, 1:] = np.clip(q, *lim)
        found = np.array(table.lookup(mx.array(rows)))
        return np.where(found < 0, empty_row, found)

    if mode == "nearest":
        rows = lookup(np.floor(p / cell).astype(np.int64))
        return padded[mx.array(rows.astype(np.int32))]

    u = p / cell - 0.5
    base = np.floor(u)
    frac = u - base
    base = base.astype(np.int64)
    corners = np.array([(i, j, k) for i in (0, 1) for j in (0, 1) for k in (0, 1)], dtype=np.int64)
    # (N, 8, 3) corner voxels; weights = prod over axes of frac or 1 - frac
    q = base[:, None, :] + corners[None]
    w = np.prod(np.where(corners[None] == 1, frac[:, None, :], 1.0 - frac[:, None, :]), axis=2)
    rows = lookup(q.reshape(-1, 3)).reshape(n, 8)
    w = np.where(rows == empty_row, 0.0, w)
    total = w.sum(axis=1, keepdims=True)
    w = np.divide(w, total, out=np.zeros_like(w), where=total > 0)
    gathered = padded[mx.array(rows.astype(np.int32))]  # (N, 8, C)
    acc = mx.float32 if x.dtype != mx.float32 else x.dtype
    y = (gathered.astype(acc) * mx.array(w.astype(np.float32))[:, :, None]).sum(axis=1)
    return y.astype(x.dtype)
