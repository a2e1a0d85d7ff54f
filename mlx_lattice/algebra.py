"""Conversions and element-wise algebra on sparse tensors.

- :func:`to_dense` / :func:`from_dense`: to and from dense ``(B, X, Y, Z, C)``
  grids (channels last, the layout of ``mlx.nn.Conv3d``).
- :func:`cat`: feature concatenation of tensors on identical coordinates.
- :func:`fork`: one tensor handed to two layers (its gradients summed in
  one multithreaded pass on the CPU).
- :func:`add`, :func:`sub`, :func:`mul`, :func:`maximum`, :func:`minimum`:
  element-wise ops on the same voxels, or, when a ``mode`` asks for it, on
  the union or the intersection of two supports.
- :func:`prune`, :func:`crop`, :func:`top_k`: keep a subset of rows (by a
  mask, a box, or the largest scores per batch item).
- :func:`sparse_collate`: several scenes as the batch items of one tensor.
- :func:`record_calls`: the feature arrays of every ``cat`` and ``fork`` call
  in a block (for profilers).

Coordinates are bookkeeping (NumPy and the coordinate hash table); features
flow through MLX gathers and scatters, so gradients reach every input.
"""

from __future__ import annotations

import numpy as np
import mlx.core as mx

from . import _ext, backends
from ._args import as_coords, as_feats, triple
from ._recorder import CallRecorder
from .manager import CoordinateManager
from .tensor import SparseTensor

__all__ = [
    "to_dense",
    "from_dense",
    "cat",
    "fork",
    "add",
    "sub",
    "mul",
    "maximum",
    "minimum",
    "prune",
    "crop",
    "top_k",
    "top_k_mask",
    "sparse_collate",
]


def _check(op, *xs):
    for x in xs:
        if not isinstance(x, SparseTensor):
            raise TypeError(f"{op}: expected SparseTensor, got {type(x).__name__}")


def _coords_np(x: SparseTensor) -> np.ndarray:
    return np.array(x.coords).astype(np.int64).reshape(-1, 4)


def _lookup(table_owner: SparseTensor, coords: mx.array) -> np.ndarray:
    """Rows of ``coords`` in ``table_owner``'s coordinate set (-1 where absent)."""
    if coords.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    return np.array(table_owner.coordinate_set.table.lookup(coords)).astype(np.int64)


def _gather_rows(feats: mx.array, rows: np.ndarray) -> mx.array:
    """feats[rows] with zeros where rows < 0."""
    c = feats.shape[1]
    padded = mx.concatenate([feats, mx.zeros((1, c), dtype=feats.dtype)], axis=0)
    idx = np.where(rows < 0, feats.shape[0], rows).astype(np.int32)
    return padded[mx.array(idx)]


def _same_layout(op, a: SparseTensor, b: SparseTensor):
    if a.stride != b.stride:
        raise ValueError(f"{op}: tensor strides differ: {a.stride} and {b.stride}")


def _new_tensor(manager: CoordinateManager, coords: np.ndarray, feats: mx.array, stride, num_batches=0) -> SparseTensor:
    """A tensor on a new set of ``manager``; ``num_batches``: the batch size
    it keeps (its source's, so empty trailing batch items survive)."""
    cset = manager.register(mx.array(np.ascontiguousarray(coords, dtype=np.int32)), stride)
    cset._declare_batches(num_batches)  # a new set: no tensor holds it yet
    return SparseTensor._from_set(cset, feats, manager)


# ---------------------------------------------------------------- dense
def to_dense(x: SparseTensor, shape=None, *, origin=(0, 0, 0)) -> mx.array:
    """Scatter the features onto a zero-filled dense grid ``(B, X, Y, Z, C)``.

    The voxel ``(b, x, y, z)`` lands at ``[b, x - ox, y - oy, z - oz]`` with
    ``origin = (ox, oy, oz)``. ``shape`` is ``(X, Y, Z)`` or ``(B, X, Y, Z)``;
    by default the smallest grid holding every voxel (``B = x.num_batches``).
    A voxel outside the grid raises ``ValueError``. Differentiable in
    ``x.feats``.
    """
    _check("to_dense", x)
    org = np.asarray(triple(origin, "origin", minimum=-(2**31)), dtype=np.int64)
    c = _coords_np(x)
    rel = c[:, 1:] - org
    if shape is None:
        spatial = tuple(int(v) + 1 for v in rel.max(axis=0)) if len(c) else (0, 0, 0)
        n_b = x.num_batches
    else:
        shape = tuple(int(v) for v in shape)
        if len(shape) == 3:
            n_b, spatial = x.num_batches, shape
        elif len(shape) == 4:
            n_b, spatial = shape[0], shape[1:]
        else:
            raise ValueError(f"shape must be (X, Y, Z) or (B, X, Y, Z), got {shape}")
    if len(c):
        outside = (rel < 0).any(axis=1) | (rel >= np.asarray(spatial)).any(axis=1) | (c[:, 0] >= n_b)
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            raise ValueError(
                f"to_dense: voxel {c[i].tolist()} lies outside the grid of shape "
                f"{(n_b, *spatial)} at origin {org.tolist()}"
            )
    ch = x.feats.shape[1]
    flat = ((c[:, 0] * spatial[0] + rel[:, 0]) * spatial[1] + rel[:, 1]) * spatial[2] + rel[:, 2]
    size = n_b * spatial[0] * spatial[1] * spatial[2]
    dense = mx.zeros((size, ch), dtype=x.dtype)
    if len(c):
        dense = dense.at[mx.array(flat.astype(np.int32))].add(x.feats)
    return dense.reshape(n_b, *spatial, ch)


def from_dense(
    dense, threshold=0.0, mask=None, *, origin=(0, 0, 0), stride=1, manager=None
) -> SparseTensor:
    """The active cells of a dense grid ``(B, X, Y, Z, C)`` (or ``(X, Y, Z, C)``).

    Active: where ``mask`` (``(B, X, Y, Z)`` booleans) is true if given, else
    where some channel has ``|value| > threshold`` (the default 0 keeps every
    non-zero cell). Rows are sorted by ``(batch, x, y, z)``; cell
    ``[b, i, j, k]`` becomes voxel ``(b, i + ox, j + oy, k + oz)``. The
    features are gathered from ``dense``, so gradients flow back to it.
    """
    if not isinstance(dense, mx.array):
        dense = mx.array(np.asarray(dense, dtype=np.float32))
    if dense.ndim == 4:
        dense = dense[None]
    if dense.ndim != 5:
        raise ValueError(f"dense must have shape (B, X, Y, Z, C) or (X, Y, Z, C), got {tuple(dense.shape)}")
    grid = tuple(dense.shape[:4])
    if mask is not None:
        m = np.asarray(mask.astype(mx.bool_) if isinstance(mask, mx.array) else mask).astype(bool)
        if m.ndim == 3:
            m = m[None]
        if m.shape != grid:
            raise ValueError(f"mask must have shape {grid} (or without the batch axis), got {m.shape}")
    else:
        mag = np.abs(np.array(mx.stop_gradient(dense).astype(mx.float32)))
        m = (mag > float(threshold)).any(axis=-1)
    flat = np.flatnonzero(m.reshape(-1))
    cells = np.stack(np.unravel_index(flat, grid), axis=1).astype(np.int64)
    cells[:, 1:] += np.asarray(triple(origin, "origin", minimum=-(2**31)), dtype=np.int64)
    feats = dense.reshape(-1, dense.shape[4])[mx.array(flat.astype(np.int32))]
    manager = manager if manager is not None else CoordinateManager()
    return _new_tensor(manager, cells, feats, triple(stride, "stride", minimum=1), num_batches=grid[0])


# ---------------------------------------------------------------- algebra
_calls = CallRecorder()


def record_calls():
    """``with record_calls() as calls: ...`` collects ``(op, arrays)`` for
    every :func:`cat` (``"cat"``, the feature arrays of its tensors) and
    :func:`fork` (``"fork"``, ``[x's features]``) call in the block, in call
    order. Open blocks nest, each collecting every call."""
    return _calls.record()


def cat(tensors) -> SparseTensor:
    """Concatenate features (along channels) of tensors on identical coordinates.

    The result keeps the first tensor's rows and coordinate set. Tensors on
    the same coordinate set concatenate directly; the others must hold the
    same voxels (in any order) and are aligned by hash lookup.
    """
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat needs at least one tensor")
    _check("cat", *tensors)
    if _calls:
        _calls.add(("cat", [t.feats for t in tensors]))
    first = tensors[0]
    parts = [first.feats]
    for t in tensors[1:]:
        _same_layout("cat", first, t)
        if t.feats.dtype != first.feats.dtype:
            raise TypeError("cat: feature dtypes differ")
        if t.coordinate_set is first.coordinate_set:
            parts.append(t.feats)
            continue
        if len(t) != len(first):
            raise ValueError(f"cat: coordinates differ ({len(first)} and {len(t)} rows)")
        rows = _lookup(t, first.coords)
        if (rows < 0).any():
            i = int(np.flatnonzero(rows < 0)[0])
            raise ValueError(
                f"cat: coordinates differ; voxel {_coords_np(first)[i].tolist()} is missing from a tensor"
            )
        parts.append(t.feats[mx.array(rows.astype(np.int32))])
    return SparseTensor._from_set(first.coordinate_set, _concat_columns(parts), first.manager)


# Feature dtypes of the CPU primitives behind cat and fork.
_CPU_FEATURE_DTYPES = (mx.float32, mx.float16, mx.bfloat16)


def _on_cpu(*arrays) -> bool:
    return backends.current().native_column_ops and all(
        a.ndim == 2 and a.dtype in _CPU_FEATURE_DTYPES for a in arrays
    )


def _concat_columns(parts):
    """Columns side by side: on the CPU one multithreaded primitive (MLX's
    Concatenate runs on one thread), the same bits; elsewhere
    ``mx.concatenate``. Both backward passes slice the cotangent."""
    if len(parts) > 1 and _on_cpu(*parts):
        return _ext.concat_columns(parts)
    return mx.concatenate(parts, axis=1)


def fork(x):
    """``(x, x)`` for a SparseTensor or features array that feeds two layers
    (a residual block's input, a skip connection).

    Where an array feeds two layers, MLX sums its two cotangents with an
    ``Add`` on one thread. On the CPU the two results here are one primitive's
    outputs sharing x's buffer (nothing is copied), and its backward pass sums
    both cotangents in one multithreaded pass, bitwise equal to ``a + b``.
    Elsewhere (GPUs, other dtypes) it returns ``(x, x)`` unchanged.
    """
    f = x.feats if isinstance(x, SparseTensor) else x
    if not isinstance(f, mx.array):
        raise TypeError(f"fork: x must be a SparseTensor or an mx.array, got {type(x).__name__}")
    if _calls:
        _calls.add(("fork", [f]))
    if not _on_cpu(f):
        return x, x
    a, b = _ext.fork(f)
    if isinstance(x, SparseTensor):
        return x.replace(a), x.replace(b)
    return a, b


# Element-wise binary ops: the value a voxel absent from one operand takes
# (None: the other operand's value passes through), and the array op.
_BINARY = {
    "add": (0.0, mx.add),
    "sub": (0.0, mx.subtract),
    "mul": (0.0, mx.multiply),
    "maximum": (None, mx.maximum),
    "minimum": (None, mx.minimum),
}


def _different_supports(op, a, b, b_rows_of_a) -> ValueError:
    shared = int((b_rows_of_a >= 0).sum())
    return ValueError(
        f"{op}: a and b hold different voxels (a {len(a)}, b {len(b)}, {shared} in both), so there is no "
        f"row-by-row {op}. Pass mode='union' (every voxel of either) or mode='intersection' (voxels of "
        "both) to combine different supports. If both should lie on the same voxels, build the second "
        "tensor from the first: a.replace(feats), or SparseTensor(a.coords, feats), which shares a's "
        "coordinate manager (a tensor rebuilt from copied coordinates gets its own manager, and a later "
        "conv_transpose3d may land on other voxels)"
    )


def _binary(op, a, b, mode):
    _check(op, a, b)
    absent, fn = _BINARY[op]
    if mode not in (None, "union", "intersection"):
        raise ValueError(f"{op}: mode must be None, 'union' or 'intersection', got {mode!r}")
    _same_layout(op, a, b)
    if a.feats.shape[1] != b.feats.shape[1]:
        raise ValueError(f"{op}: channel counts differ: {a.feats.shape[1]} and {b.feats.shape[1]}")
    if a.feats.dtype != b.feats.dtype:
        raise TypeError(f"{op}: feature dtypes differ")
    if a.coordinate_set is b.coordinate_set:
        return a.replace(fn(a.feats, b.feats))
    b_rows_of_a = _lookup(b, a.coords)  # where each of a's voxels sits in b
    on_b = b_rows_of_a >= 0
    if mode is None:
        # No mode: the voxel sets must be equal (rows in any order).
        if len(a) != len(b) or not on_b.all():
            raise _different_supports(op, a, b, b_rows_of_a)
        return a.replace(fn(a.feats, b.feats[mx.array(b_rows_of_a.astype(np.int32))]))
    if mode == "intersection":
        if on_b.all():
            return a.replace(fn(a.feats, _gather_rows(b.feats, b_rows_of_a)))
        sel = np.flatnonzero(on_b)
        feats = fn(a.feats[mx.array(sel.astype(np.int32))], b.feats[mx.array(b_rows_of_a[sel].astype(np.int32))])
        return _new_tensor(a.manager, _coords_np(a)[sel], feats, a.stride, max(a.num_batches, b.num_batches))
    a_rows_of_b = _lookup(a, b.coords)
    extra = np.flatnonzero(a_rows_of_b < 0)
    zeros = lambda n: mx.zeros((n, a.feats.shape[1]), dtype=a.dtype)  # noqa: E731
    if absent is None:
        # Only where b holds the voxel does the op apply; elsewhere a passes through.
        mask = mx.array(on_b)[:, None]
        on_a = mx.where(mask, fn(a.feats, _gather_rows(b.feats, b_rows_of_a)), a.feats)
        b_only = b.feats[mx.array(extra.astype(np.int32))]
    else:
        on_a = fn(a.feats, _gather_rows(b.feats, b_rows_of_a))
        b_only = fn(zeros(len(extra)), b.feats[mx.array(extra.astype(np.int32))])
    if len(extra) == 0:
        return a.replace(on_a)
    feats = mx.concatenate([on_a, b_only], axis=0)
    coords = np.concatenate([_coords_np(a), _coords_np(b)[extra]], axis=0)
    return _new_tensor(a.manager, coords, feats, a.stride, max(a.num_batches, b.num_batches))


def add(a: SparseTensor, b: SparseTensor, mode=None) -> SparseTensor:
    """Element-wise ``a + b``.

    ``mode=None`` (the default) needs both tensors on the same voxels: on
    the same coordinate set the op runs row by row on ``a``'s rows; two sets
    holding the same voxels in another order are aligned by hash lookup
    (``a``'s rows and set, as :func:`cat`); different voxels raise
    ``ValueError``, never a silent union. To combine different supports,
    ask for one (missing voxels count as zero):

    - ``'union'``: ``a``'s rows in ``a``'s order, then ``b``'s voxels absent
      from ``a`` in ``b``'s order (``a``'s coordinate set when ``b``'s voxels
      are all in ``a``);
    - ``'intersection'``: ``a``'s rows that are also in ``b``, in ``a``'s
      order (``a``'s coordinate set when all of them are).

    The output belongs to ``a``'s manager. Both tensors need the same stride,
    channel count and dtype. :func:`sub`, :func:`mul`, :func:`maximum` and
    :func:`minimum` share these rules.
    """
    return _binary("add", a, b, mode)


def sub(a: SparseTensor, b: SparseTensor, mode=None) -> SparseTensor:
    """Element-wise ``a - b``; with ``mode='union'`` missing voxels count as
    zero (a voxel only in ``b`` gives ``-b``). Modes and row order as
    :func:`add`."""
    return _binary("sub", a, b, mode)


def mul(a: SparseTensor, b: SparseTensor, mode=None) -> SparseTensor:
    """Element-wise ``a * b``. Modes and row order as :func:`add`; with
    ``mode='union'`` the voxels in only one tensor are kept with value zero
    (a missing voxel counts as zero), ``mode='intersection'`` keeps the
    voxels of both (the usual choice for a mask)."""
    return _binary("mul", a, b, mode)


def maximum(a: SparseTensor, b: SparseTensor, mode=None) -> SparseTensor:
    """Element-wise maximum. A missing voxel is no value, not a zero (as in
    max pooling): with ``mode='union'`` a voxel held by one tensor only keeps
    that tensor's features. Modes and row order as :func:`add`; gradients
    follow ``mx.maximum``."""
    return _binary("maximum", a, b, mode)


def minimum(a: SparseTensor, b: SparseTensor, mode=None) -> SparseTensor:
    """Element-wise minimum; missing voxels as in :func:`maximum`."""
    return _binary("minimum", a, b, mode)


def prune(x: SparseTensor, keep) -> SparseTensor:
    """The rows of ``x`` where ``keep`` ((N,) booleans) is true, in order.

    Returns ``x`` itself when every row is kept. Gradients flow to the kept
    rows' features.
    """
    _check("prune", x)
    k = np.asarray(keep.astype(mx.bool_) if isinstance(keep, mx.array) else keep).astype(bool).reshape(-1)
    if k.shape != (len(x),):
        raise ValueError(f"prune: keep must have shape ({len(x)},), got {k.shape}")
    if k.all():
        return x
    sel = np.flatnonzero(k)
    feats = x.feats[mx.array(sel.astype(np.int32))]
    return _new_tensor(x.manager, _coords_np(x)[sel], feats, x.stride, x.num_batches)


def _box(v, name, n_b):
    a = np.asarray(v)
    if not np.issubdtype(a.dtype, np.integer) or a.shape not in ((3,), (n_b, 3)):
        raise ValueError(f"crop: {name} must be 3 ints or a ({n_b}, 3) integer array (one box per batch item), got {a.tolist()!r}")
    return np.broadcast_to(a.astype(np.int64), (n_b, 3))


def crop(x: SparseTensor, start, stop) -> SparseTensor:
    """The voxels with ``start <= (x, y, z) < stop``, in row order.

    The box is in ``x``'s grid units: ``start`` and ``stop`` are 3 ints (one
    box for every batch item) or ``(B, 3)`` integer arrays with
    ``B = x.num_batches`` (a box per batch item). Returns ``x`` itself when
    nothing is cut; gradients flow to the kept rows.
    """
    _check("crop", x)
    n_b = x.num_batches
    lo, hi = _box(start, "start", n_b), _box(stop, "stop", n_b)
    c = _coords_np(x)
    b = c[:, 0]
    keep = ((c[:, 1:] >= lo[b]) & (c[:, 1:] < hi[b])).all(axis=1)
    return prune(x, keep)


def _scores(x: SparseTensor, scores, op) -> np.ndarray:
    if scores is None:
        if x.feats.shape[1] != 1:
            raise ValueError(f"{op}: without scores, x must have one channel, got {x.feats.shape[1]}")
        scores = x.feats
    if isinstance(scores, SparseTensor):
        if scores.coordinate_set is not x.coordinate_set:
            raise ValueError(f"{op}: scores must be a SparseTensor on x's coordinate set")
        scores = scores.feats
    if isinstance(scores, mx.array):
        scores = np.array(mx.stop_gradient(scores).astype(mx.float32))
    s = np.asarray(scores)
    if s.ndim == 2 and s.shape[1] == 1:
        s = s[:, 0]
    if s.shape != (len(x),) or not (np.issubdtype(s.dtype, np.floating) or np.issubdtype(s.dtype, np.integer)):
        raise ValueError(f"{op}: scores must be ({len(x)},) or ({len(x)}, 1) numbers, got shape {s.shape}")
    return s.astype(np.float64)


def top_k_mask(x: SparseTensor, k: int, scores=None) -> np.ndarray:
    """(N,) booleans marking, per batch item, the ``k`` rows with the
    highest scores (all rows of an item with fewer than ``k``). Ties go to
    the lower row index; NaN scores rank last."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"top_k: k must be a non-negative int, got {k!r}")
    s = _scores(x, scores, "top_k")
    n = len(x)
    if n == 0:
        return np.zeros(0, dtype=bool)
    b = _coords_np(x)[:, 0]
    neg = np.where(np.isnan(s), np.inf, -s)
    order = np.lexsort((np.arange(n), neg, b))  # by batch, score descending, row
    first = np.searchsorted(b[order], b[order], side="left")
    rank = np.arange(n) - first
    keep = np.zeros(n, dtype=bool)
    keep[order[rank < k]] = True
    return keep


def top_k(x: SparseTensor, k: int, scores=None) -> SparseTensor:
    """Per batch item, the ``k`` rows with the highest ``scores``, in row order.

    ``scores``: ``(N,)`` or ``(N, 1)`` numbers, or a one-channel SparseTensor
    on ``x``'s coordinate set; by default ``x``'s own features (one channel).
    Batch items with fewer than ``k`` rows keep them all. Ties go to the
    lower row index; NaN scores rank last. The selection is not
    differentiated; gradients flow to the kept rows' features.
    """
    _check("top_k", x)
    return prune(x, top_k_mask(x, k, scores))


# ---------------------------------------------------------------- batching
def sparse_collate(items, *, manager=None) -> SparseTensor:
    """Stack scenes as the batch items of one tensor.

    ``items``: SparseTensors, or ``(coords, feats)`` pairs with coords
    ``(N, 3)`` (one scene) or ``(N, 4)`` (already batched). Item ``i``'s batch
    indices are shifted by the number of batch items before it, so each
    scene keeps its own batch index; rows stay in item order. Features are
    concatenated (gradients flow back to each item). SparseTensor items must
    share one stride, which the result keeps. An empty scene still counts as
    a batch item, at the end too: ``num_batches`` is the number of scenes
    (items with several batch items count theirs), and global pooling gives
    every scene a row.
    """
    items = list(items)
    if not items:
        raise ValueError("sparse_collate needs at least one item")
    coords_parts, feats_parts = [], []
    stride = None
    offset = 0
    for i, item in enumerate(items):
        if isinstance(item, SparseTensor):
            c = _coords_np(item)
            f = item.feats
            n_b = item.num_batches
            if stride is not None and item.stride != stride:
                raise ValueError(f"sparse_collate: item {i} has stride {item.stride}, expected {stride}")
            stride = item.stride
        else:
            try:
                c_raw, f = item
            except (TypeError, ValueError):
                raise TypeError(
                    f"sparse_collate: item {i} must be a SparseTensor or a (coords, feats) pair"
                ) from None
            c = np.asarray(c_raw.astype(mx.int64) if isinstance(c_raw, mx.array) else c_raw)
            if c.ndim != 2 or c.shape[1] not in (3, 4) or not np.issubdtype(c.dtype, np.integer):
                raise ValueError(f"sparse_collate: item {i} coords must be (N, 3) or (N, 4) integers")
            c = c.astype(np.int64)
            if c.shape[1] == 3:
                c = np.concatenate([np.zeros((len(c), 1), np.int64), c], axis=1)
            n_b = int(c[:, 0].max()) + 1 if len(c) else 0
            f = as_feats(f, len(c))
        c = c.copy()
        c[:, 0] += offset
        offset += max(n_b, 1)  # an empty scene still takes its batch index
        coords_parts.append(c)
        feats_parts.append(f)
    dtypes = {f.dtype for f in feats_parts}
    if len(dtypes) > 1:
        raise TypeError("sparse_collate: feature dtypes differ")
    coords = np.concatenate(coords_parts, axis=0)
    feats = mx.concatenate(feats_parts, axis=0)
    out = SparseTensor(as_coords(coords), feats, stride=stride or 1, manager=manager)
    # Every item keeps its batch index, empty trailing ones included.
    out.coordinate_set._declare_batches(offset)  # a set made here
    return out
