"""Set operations on coordinates: lookup, membership, union, intersection.

Each argument is a SparseTensor, a :class:`~mlx_lattice.CoordinateSet`, or
an ``(N, 4)`` integer array of unique rows ``(batch, x, y, z)`` in any layout
the SparseTensor constructor takes (lists, NumPy or MLX arrays of any
integer dtype, transposed or sliced views). Lookups go
through the coordinate hash table (a tensor's own table when it has one), so
nothing is sorted and the row order of the inputs is kept. Coordinates are
compared as they are: the sets must share a stride for the answer to mean
anything, which is checked when both are tensors or sets.
"""

from __future__ import annotations

import numpy as np
import mlx.core as mx

from . import _ext
from ._args import as_table_coords
from .manager import CoordinateSet
from .tensor import SparseTensor

__all__ = ["lookup", "contains", "union", "intersection"]


def _table(s, name):
    if isinstance(s, SparseTensor):
        return s.coordinate_set.table, s.coords, s.stride
    if isinstance(s, CoordinateSet):
        return s.table, s.coords, s.stride
    coords = as_table_coords(s, name)
    return _ext.CoordTable(coords), coords, None


def _coords(q, name):
    if isinstance(q, SparseTensor):
        return q.coords, q.stride
    if isinstance(q, CoordinateSet):
        return q.coords, q.stride
    return as_table_coords(q, name), None


def _strides(a, b):
    if a is not None and b is not None and a != b:
        raise ValueError(f"coordinate strides differ: {a} and {b}")


def lookup(coords, queries) -> mx.array:
    """The inverse map: for each query row, its row in ``coords``, or -1.

    Returns ``(M,)`` int32. ``queries`` may repeat rows; ``coords`` must not
    (a SparseTensor's never do; an array with repeated rows raises).
    """
    table, _, s_a = _table(coords, "coords")
    q, s_b = _coords(queries, "queries")
    _strides(s_a, s_b)
    if q.shape[0] == 0:
        return mx.zeros((0,), dtype=mx.int32)
    return table.lookup(q).astype(mx.int32)


def contains(coords, queries) -> mx.array:
    """``(M,)`` booleans: whether each query row is in ``coords``."""
    return lookup(coords, queries) >= 0


def _rows_np(a) -> np.ndarray:
    return np.array(a).astype(np.int32).reshape(-1, 4)


def _pair(a, b):
    """(a's table, a's coords, b's table, b's coords), strides checked."""
    ta, ca, s_a = _table(a, "a")
    tb, cb, s_b = _table(b, "b")
    _strides(s_a, s_b)
    return ta, ca, tb, cb


def _rows_in(table, queries) -> np.ndarray:
    if queries.shape[0] == 0:
        return np.zeros(0, dtype=np.int32)
    return np.array(table.lookup(queries)).astype(np.int32)


def union(a, b) -> mx.array:
    """``a``'s rows in order, then ``b``'s rows absent from ``a`` in ``b``'s
    order: ``(N, 4)`` int32 (the support of :func:`mlx_lattice.add`)."""
    ta, ca, _, cb = _pair(a, b)
    extra = _rows_np(cb)[_rows_in(ta, cb) < 0]
    return mx.array(np.concatenate([_rows_np(ca), extra], axis=0))


def intersection(a, b) -> mx.array:
    """``a``'s rows that are also in ``b``, in ``a``'s order: ``(N, 4)``
    int32 (the support of :func:`mlx_lattice.mul`)."""
    _, ca, tb, _ = _pair(a, b)
    return mx.array(_rows_np(ca)[_rows_in(tb, ca) >= 0])
