"""Plumbing of sparse generative decoders: grow, coarsen, prune, interpolate.

- :func:`expand`: every voxel to its ``s^3`` children at the finer stride.
- :func:`downsample`: coarsen coordinates by ``s`` (deduplicated), reducing
  the features that merge.
- :func:`prune_by_logits`: keep the voxels whose logit clears a threshold
  and/or the ``k`` best per batch item, plus any given voxels (``keep=``,
  the targets while training).
- :func:`upsample`: trilinear interpolation onto a finer coordinate set.

The coordinate sets come from the tensor's ``CoordinateManager`` with the
geometry of the matching convolution, so they are shared: ``expand(x, 2)``
lies on the set a ``generative_conv_transpose3d`` with kernel 2, stride 2
produces from ``x``; ``downsample(x, 2)`` on the set of a kernel-2, stride-2
``conv3d`` (and a later ``conv_transpose3d`` / ``pool_transpose3d`` of
stride 2 lands back on ``x``'s rows). Everything is per batch item (the
batch column is never mixed) and differentiable in the features.
"""

from __future__ import annotations

import itertools

import numpy as np
import mlx.core as mx

from . import algebra, coordsets, pooling
from ._args import as_coords, as_table_coords, triple
from .manager import CoordinateSet
from ._segment import accumulation_dtype
from .relation import KernelGeometry
from .tensor import SparseTensor

__all__ = ["expand", "downsample", "prune_by_logits", "upsample"]

_REDUCE = {"mean": pooling.avg_pool3d, "sum": pooling.sum_pool3d, "max": pooling.max_pool3d}


def _check(op, x):
    if not isinstance(x, SparseTensor):
        raise TypeError(f"{op}: x must be a SparseTensor, got {type(x).__name__}")


def expand(x: SparseTensor, stride=2) -> SparseTensor:
    """Each voxel ``p`` becomes its children ``s*p + d``, ``0 <= d < s`` per
    axis, each holding a copy of ``p``'s features.

    Rows sorted by ``(batch, x, y, z)``; output tensor stride
    ``x.stride / s``. The set is the one
    ``generative_conv_transpose3d(x, w, stride=s)`` with a kernel of size
    ``s`` produces (shared through the manager). Gradients sum over children.
    """
    _check("expand", x)
    s = triple(stride, "stride", minimum=1)
    if s == (1, 1, 1):
        return x
    rel, dst = x.manager.generative_relation(x.coordinate_set, KernelGeometry(s, s))
    # Kernel == stride: every child has exactly one edge, from its parent.
    feats = x.feats[rel.in_idx] if rel.edges else mx.zeros((0, x.feats.shape[1]), x.dtype)
    return SparseTensor._from_set(dst, feats, x.manager)


def downsample(x: SparseTensor, stride=2, reduce="mean") -> SparseTensor:
    """Coordinates ``floor(p / s)`` (deduplicated, sorted by
    ``(batch, x, y, z)``) with the ``reduce`` (``'mean'``, ``'sum'`` or
    ``'max'``) of the features that merge.

    The same as the pooling op with kernel size and stride ``s``; output
    tensor stride ``x.stride * s``.
    """
    _check("downsample", x)
    if reduce not in _REDUCE:
        raise ValueError(f"downsample: reduce must be one of {sorted(_REDUCE)}, got {reduce!r}")
    s = triple(stride, "stride", minimum=1)
    return _REDUCE[reduce](x, s, s)


def prune_by_logits(x: SparseTensor, logits, threshold=0.0, *, k=None, keep=None) -> SparseTensor:
    """The voxels of ``x`` kept by their occupancy logits, in row order.

    ``logits``: a one-channel SparseTensor on ``x``'s coordinate set, or
    ``(N,)`` / ``(N, 1)`` numbers. A voxel is kept when its logit is above
    ``threshold`` (``None``: no threshold) and, when ``k`` is given, it is
    among the ``k`` highest logits of its batch item (ties to the lower
    row). NaN logits are never kept by the threshold.

    ``keep``: voxels kept whatever their logits (the target voxels when
    training a completion decoder, so every level sees the true surface):
    a SparseTensor or CoordinateSet of ``x``'s stride, or an ``(M, 4)``
    integer array in ``x``'s grid units (rows may repeat; rows not in ``x``
    are ignored, nothing is added). A voxel is then kept when it passes the
    logits as above *or* is in ``keep``.

    The selection is not differentiated; gradients flow to the kept rows'
    features.
    """
    _check("prune_by_logits", x)
    scores = algebra._scores(x, logits, "prune_by_logits")
    mask = np.ones(len(x), dtype=bool)
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.number)):
            raise TypeError(f"prune_by_logits: threshold must be a number or None, got {threshold!r}")
        mask &= scores > float(threshold)
    if k is not None:
        mask &= algebra.top_k_mask(x, k, scores)
    if keep is not None:
        mask |= _members(x, keep)
    return algebra.prune(x, mask)


def _members(x: SparseTensor, keep) -> np.ndarray:
    """(N,) booleans: which rows of ``x`` are voxels of ``keep``."""
    if isinstance(keep, (SparseTensor, CoordinateSet)) and keep.stride != x.stride:
        raise ValueError(
            f"prune_by_logits: keep has stride {keep.stride} but x has stride {x.stride}; keep must "
            "hold voxels of x's grid"
        )
    # Looked up in x's table: keep's rows may repeat and may lie outside x.
    rows = np.array(coordsets.lookup(x, _as_queries(keep))).astype(np.int64)
    found = np.zeros(len(x), dtype=bool)
    found[rows[rows >= 0]] = True
    return found


def _as_queries(keep):
    if isinstance(keep, (SparseTensor, CoordinateSet)):
        return keep.coords
    try:
        return as_table_coords(keep, "keep")
    except TypeError as e:
        raise TypeError(
            f"prune_by_logits: keep must be a SparseTensor, a CoordinateSet or an (M, 4) integer "
            f"coordinate array; {e}"
        ) from None
    except ValueError as e:
        raise ValueError(f"prune_by_logits: {e}") from None


def _target(x: SparseTensor, coordinates, stride):
    if isinstance(coordinates, SparseTensor):
        t = coordinates.stride
        if stride is not None and triple(stride, "stride", minimum=1) != t:
            raise ValueError(f"upsample: stride {stride} disagrees with the target tensor's stride {t}")
        if coordinates.manager is x.manager:
            return coordinates.coordinate_set
        coords = coordinates.coords
    else:
        t = (1, 1, 1) if stride is None else triple(stride, "stride", minimum=1)
        coords = as_coords(coordinates, "coordinates")
    cset = x.manager.register(coords, t)
    if cset.stride != t:
        raise ValueError(f"upsample: these coordinates were registered with stride {cset.stride}, not {t}")
    return cset


def upsample(x: SparseTensor, coordinates, *, stride=None) -> SparseTensor:
    """Trilinear interpolation of ``x`` at the voxels of ``coordinates``.

    ``coordinates``: a SparseTensor (its stride is the target stride) or an
    ``(M, 4)`` integer array on the grid of tensor stride ``stride``
    (default 1). Voxel ``c`` of stride ``t`` covers ``[t*c, t*(c+1))`` of the
    finest grid, so a target voxel ``f`` sits at ``u = (t*(f + 1/2)) / s -
    1/2`` in the units of ``x``'s voxels (stride ``s``); its value is
    ``sum_c w_c x[c]`` over the 8 coarse voxels ``c = floor(u) + {0,1}^3``
    with ``w_c = prod(1 - |u - c|)`` (the dense trilinear upsampling with
    ``align_corners=False``).

    Normalisation: coarse voxels that are not active are left out and the
    remaining weights are divided by their sum, so a constant field stays
    constant next to the surface; a target with no active coarse neighbour
    of non-zero weight gets zeros. Output rows follow ``coordinates``;
    differentiable in ``x.feats``.
    """
    _check("upsample", x)
    dst = _target(x, coordinates, stride)
    s = np.asarray(x.stride, dtype=np.int64)
    t = np.asarray(dst.stride, dtype=np.int64)
    f = np.array(dst.coords).astype(np.int64).reshape(-1, 4)
    m, c = len(f), x.feats.shape[1]
    if m == 0 or len(x) == 0:
        return SparseTensor._from_set(dst, mx.zeros((m, c), dtype=x.dtype), x.manager)
    # u = num / den exactly: num = t*(2f + 1) - s, den = 2s.
    num = t * (2 * f[:, 1:] + 1) - s
    den = 2 * s
    base = np.floor_divide(num, den)
    frac = (num - base * den) / den  # in [0, 1)
    corners = np.array(list(itertools.product((0, 1), repeat=3)), dtype=np.int64)  # (8, 3)
    cand = base[:, None, :] + corners[None]  # (M, 8, 3)
    w = np.prod(np.where(corners[None] == 1, frac[:, None, :], 1.0 - frac[:, None, :]), axis=2)
    queries = np.concatenate([np.broadcast_to(f[:, None, :1], (m, 8, 1)), cand], axis=2).reshape(-1, 4)
    lim = np.iinfo(np.int32)
    inside = ((queries >= lim.min) & (queries <= lim.max)).all(axis=1)
    rows = np.full(len(queries), -1, dtype=np.int64)
    if inside.any():
        rows[inside] = algebra._lookup(x, mx.array(queries[inside].astype(np.int32)))
    rows = rows.reshape(m, 8)
    w = np.where(rows >= 0, w, 0.0)
    total = w.sum(axis=1, keepdims=True)
    w = np.where(total > 0, w / np.where(total > 0, total, 1.0), 0.0)
    acc = accumulation_dtype(x.dtype)
    padded = mx.concatenate([x.feats, mx.zeros((1, c), dtype=x.dtype)], axis=0)
    idx = mx.array(np.where(rows < 0, len(x), rows).astype(np.int32).reshape(-1))
    g = padded[idx].reshape(m, 8, c).astype(acc)
    y = (g * mx.array(w.astype(np.float32)).astype(acc)[:, :, None]).sum(axis=1)
    return SparseTensor._from_set(dst, y.astype(x.dtype), x.manager)
