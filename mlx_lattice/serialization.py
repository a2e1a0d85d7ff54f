"""Space-filling-curve codes and orders for batched voxel coordinates.

Point Transformer V3 attends within fixed-size patches of voxels taken along
a space-filling curve. This module computes the curves' codes and the row
orders they induce:

- ``"z"``: Morton (z-order) code, bits interleaved with x the most
  significant axis of each 3-bit group: bit ``i`` of x, y, z lands at
  ``3i + 2``, ``3i + 1``, ``3i``.
- ``"hilbert"``: Hilbert index by Skilling's transform ("Programming the
  Hilbert curve", 2004): the axes are transposed into the Hilbert
  "transpose" form, then interleaved as for Morton (x most significant).
- ``"z-trans"``, ``"hilbert-trans"``: the same curves with x and y swapped
  (axes read as ``(y, x, z)``), PTv3's second pair of orders.

Coordinates may be negative: each batch item is shifted by its own minimum
on each axis (its bounding box corner goes to the origin), as Pointcept's grid
sampling does per sample. ``depth`` is the number of bits per axis (the curve
covers a ``2**depth`` cube); by default the smallest depth holding every
shifted coordinate of the tensor, as Pointcept chooses it. The Hilbert order
depends on the depth (a deeper curve enters the cube differently); the
Morton order does not. Full key: ``batch << (3 * depth) | curve_code``, so
sorting keys sorts by batch item first: orders keep each batch item's rows
contiguous and in batch order. With ``depth <= 17`` and ``batch < 4096`` a key
fits in 63 bits.

Everything is vectorised NumPy on int64: a few dozen passes over ``N``.
"""

from __future__ import annotations

import numpy as np
import mlx.core as mx

from ._args import as_coords
from .tensor import SparseTensor

__all__ = ["CURVES", "MAX_DEPTH", "curve_code", "serialize", "serialization_order"]

CURVES = ("z", "z-trans", "hilbert", "hilbert-trans")
MAX_DEPTH = 17  # coordinates span [-65536, 65535]: extents below 2**17
_BATCH_BITS = 63 - 3 * MAX_DEPTH  # 12: batch < 4096


def _spread3(v: np.ndarray) -> np.ndarray:
    """Move bit i of each (< 2**21) value to bit 3i."""
    v = v.astype(np.uint64) & np.uint64(0x1FFFFF)
    for shift, mask in (
        (32, 0x1F00000000FFFF),
        (16, 0x1F0000FF0000FF),
        (8, 0x100F00F00F00F00F),
        (4, 0x10C30C30C30C30C3),
        (2, 0x1249249249249249),
    ):
        v = (v | (v << np.uint64(shift))) & np.uint64(mask)
    return v


def _interleave(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    code = (_spread3(x) << np.uint64(2)) | (_spread3(y) << np.uint64(1)) | _spread3(z)
    return code.astype(np.int64)


def _hilbert_transpose(axes: list[np.ndarray], depth: int) -> list[np.ndarray]:
    """Skilling's AxesToTranspose on three int64 arrays of ``depth``-bit values."""
    x = [a.copy() for a in axes]
    for k in range(depth - 1, 0, -1):
        p = (1 << k) - 1
        for i in range(3):
            hit = -((x[i] >> k) & 1)  # all ones where bit k of axis i is set
            # Bit set: invert the lower bits of axis 0; clear: exchange them with axis i.
            t = (x[0] ^ x[i]) & p & ~hit
            x[0] ^= (p & hit) ^ t
            if i:
                x[i] ^= t
    # Gray decode: a prefix XOR along the interleaved bit string, most significant first.
    x[1] ^= x[0]
    x[2] ^= x[1]
    t = np.zeros_like(x[2])
    for k in range(depth - 1, 0, -1):
        t ^= ((1 << k) - 1) & -((x[2] >> k) & 1)
    return [a ^ t for a in x]


def _check_curve(curve):
    if curve not in CURVES:
        raise ValueError(f"curve must be one of {list(CURVES)}, got {curve!r}")


def _check_depth(depth):
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"depth must be an int in [1, {MAX_DEPTH}], got {depth!r}")
    return int(depth)


def curve_code(xyz, curve: str = "z", depth: int = MAX_DEPTH) -> np.ndarray:
    """Curve codes of non-negative points ``xyz`` (M, 3) below ``2**depth``.

    Returns (M,) int64 codes in ``[0, 8**depth)``: a bijection of the cube
    onto its code range.
    """
    _check_curve(curve)
    depth = _check_depth(depth)
    p = np.asarray(xyz)
    if not np.issubdtype(p.dtype, np.integer):
        raise TypeError(f"xyz must have an integer dtype, got {p.dtype}")
    if p.ndim != 2 or p.shape[1] != 3:
        raise ValueError(f"xyz must have shape (M, 3), got {p.shape}")
    p = p.astype(np.int64)
    if p.size and (p.min() < 0 or p.max() >= (1 << depth)):
        raise ValueError(f"xyz values must lie in [0, {1 << depth}) for depth {depth}")
    axes = [p[:, 1], p[:, 0], p[:, 2]] if curve.endswith("-trans") else [p[:, 0], p[:, 1], p[:, 2]]
    if curve.startswith("hilbert"):
        axes = _hilbert_transpose(axes, depth)
    return _interleave(*axes)


def _shifted(coords) -> tuple[np.ndarray, np.ndarray]:
    """(batch, xyz - per-batch-item minimum) as int64 NumPy arrays."""
    if isinstance(coords, SparseTensor):
        coords = coords.coords
    c = np.array(as_coords(coords)).astype(np.int64).reshape(-1, 4)
    b = c[:, 0]
    xyz = c[:, 1:]
    if len(c) == 0:
        return b, xyz
    if b.min() < 0 or b.max() >= (1 << _BATCH_BITS):
        raise ValueError(f"coords batch column must lie in [0, {1 << _BATCH_BITS})")
    if (np.diff(b) >= 0).all():
        # Rows grouped by batch (the usual layout): one reduction per run.
        starts = np.flatnonzero(np.concatenate([[True], b[1:] != b[:-1]]))
        lo = np.zeros((int(b.max()) + 1, 3), dtype=np.int64)
        lo[b[starts]] = np.minimum.reduceat(xyz, starts, axis=0)
    else:
        lo = np.full((int(b.max()) + 1, 3), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(lo, b, xyz)
    return b, xyz - lo[b]


def serialize(coords, curve: str = "z", depth: int | None = None) -> np.ndarray:
    """Serialization keys ``batch << (3 * depth) | code`` of (N, 4) coords.

    ``coords``: rows ``(batch, x, y, z)`` (a SparseTensor, its ``coords``, an
    mx.array or a NumPy array). Each batch item is shifted to start at 0 on
    every axis; ``depth`` defaults to the bit length of the largest shifted
    coordinate (at least 1). Returns (N,) int64.
    """
    _check_curve(curve)
    b, xyz = _shifted(coords)
    if depth is None:
        depth = max(1, int(xyz.max()).bit_length()) if xyz.size else 1
    depth = _check_depth(depth)
    if xyz.size and xyz.max() >= (1 << depth):
        raise ValueError(
            f"depth {depth} covers extents below {1 << depth}, but a batch item spans {int(xyz.max()) + 1} voxels"
        )
    return (b << (3 * depth)) | curve_code(xyz, curve, depth)


def serialization_order(coords, curve: str = "z", depth: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows sorted by their serialization key, and the inverse permutation.

    Returns ``(order, inverse)``, (N,) int64 each: ``coords[order]`` runs
    along the curve, batch item by batch item; ``order[inverse] == arange(N)``.
    """
    key = serialize(coords, curve, depth)
    order = np.argsort(key, kind="stable")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return order, inverse
