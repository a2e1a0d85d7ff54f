"""Segment reductions on MLX arrays (rows grouped by an integer segment id).

Built from gathers, scatters and elementwise ops only, so MLX differentiates
them (VJP and JVP) and ``mx.compile`` traces them. Shared by pooling,
voxelization and the per-sample normalisation layers.
"""

from __future__ import annotations

import numpy as np
import mlx.core as mx

from . import backends


def accumulation_dtype(dtype):
    """Sums of half-precision features are accumulated in float32."""
    return mx.float32 if dtype in (mx.float16, mx.bfloat16) else dtype


def _scatter_unordered() -> bool:
    """Whether MLX's scatter-add may commit rows out of order here (a GPU's
    atomics): segment sums then go through the fixed-order plan."""
    return not backends.current().scatter_add_in_row_order


def _host_ids(segments: mx.array):
    """The segment ids as NumPy, or None for an array traced by ``mx.compile``
    (which cannot be read on the host)."""
    try:
        return np.asarray(segments, dtype=np.int64)
    except (ValueError, RuntimeError):
        return None


def _ordered_levels(ids: np.ndarray, n_segments: int, piece: int = 32):
    """Gather plans of a fixed-order segment sum.

    Each level cuts every segment's rows (in row order) into pieces of at most
    ``piece`` rows and lists each piece's rows, padded with the index of an
    appended zero row; a piece's sum is then an ordinary reduction over a
    short axis. The piece sums are the next level's rows, until every segment
    has at most one piece; the last entry maps segments to that piece (or to
    the zero row). The order of every addition depends on the ids alone.
    """
    levels = []
    while True:
        n = len(ids)
        counts = np.bincount(ids, minlength=n_segments)
        if counts.max(initial=0) <= 1:
            last = np.full(n_segments, n, np.int32)
            last[ids] = np.arange(n, dtype=np.int32)
            return levels, last
        width = int(min(piece, counts.max()))
        order = np.argsort(ids, kind="stable")
        starts = np.cumsum(counts) - counts
        pos = np.arange(n) - starts[ids[order]]
        pieces = -(-counts // width)
        first_piece = np.cumsum(pieces) - pieces
        row = first_piece[ids[order]] + pos // width
        plan = np.full((int(pieces.sum()), width), n, np.int32)
        plan[row, pos % width] = order
        levels.append(mx.array(plan))
        ids = np.repeat(np.arange(n_segments), pieces)


def _ordered_sum(v: mx.array, levels, last) -> mx.array:
    zero = mx.zeros((1, v.shape[1]), dtype=v.dtype)
    for plan in levels:
        v = mx.concatenate([v, zero])[plan].sum(axis=1)
    return mx.concatenate([v, zero])[mx.array(last)]


def segment_sum(values: mx.array, segments: mx.array, n_segments: int) -> mx.array:
    """``out[s] = sum of values[i] with segments[i] == s``; (n_segments, C).

    Accumulates in float32 for half-precision values and returns that dtype;
    callers cast back. The sums are reproducible bit for bit on every device:
    on the CPU the scatter adds rows in row order; on a GPU (where MLX's
    scatter-add commits rows in whatever order its atomics land) the rows are
    summed in fixed pieces by gathers and reductions, planned on the host
    from the segment ids. Inside ``mx.compile`` with traced segment ids the
    GPU plan cannot be made, and the scatter runs (equal up to rounding, not
    bitwise reproducible). MLX has no forward-mode rule for scatters, so this
    (linear) map carries its own: the JVP is the same segment sum of the
    tangent, the VJP a gather.
    """
    acc = accumulation_dtype(values.dtype)
    shape = (n_segments, values.shape[1])
    if values.shape[0] == 0:
        return mx.zeros(shape, dtype=acc)
    ids = _host_ids(segments) if _scatter_unordered() else None
    plan = _ordered_levels(ids, n_segments) if ids is not None else None

    def total(v, seg):
        if plan is not None:
            return _ordered_sum(v, *plan)
        return mx.zeros(shape, dtype=v.dtype).at[seg].add(v)

    @mx.custom_function
    def scatter_sum(v, seg):
        # stop_gradient keeps MLX's forward-mode pass from visiting the
        # scatter itself; the rules below define both derivatives.
        return total(mx.stop_gradient(v), seg)

    @scatter_sum.vjp
    def scatter_sum_vjp(primals, cotangent, output):
        v, seg = primals
        return cotangent[seg].astype(v.dtype), mx.zeros_like(seg)

    @scatter_sum.jvp
    def scatter_sum_jvp(primals, tangents):
        v, seg = primals
        return total(tangents[0].astype(v.dtype), seg)

    return scatter_sum(values.astype(acc), segments)


def segment_argmax(values: mx.array, segments: mx.array, n_segments: int):
    """Per segment and channel, the first row (lowest index) holding the maximum.

    Returns ``(rows, found)``: ``rows`` (n_segments, C) int32 row indices into
    ``values`` (0 where nothing was found) and ``found`` (n_segments, C) bool,
    False for empty segments and for segments whose maximum is NaN. Integer
    valued: no gradient flows through it.
    """
    n, c = values.shape
    if n == 0:
        return mx.zeros((n_segments, c), dtype=mx.int32), mx.zeros((n_segments, c), dtype=mx.bool_)
    v = mx.stop_gradient(values)
    peak = mx.full((n_segments, c), -mx.inf, dtype=v.dtype).at[segments].maximum(v)
    tie = v == peak[segments]
    row_id = mx.arange(n, dtype=mx.int32)[:, None]
    first = mx.full((n_segments, c), n, dtype=mx.int32).at[segments].minimum(
        mx.where(tie, row_id, n)
    )
    found = first < n
    return mx.where(found, first, 0), found


def segment_max(values: mx.array, segments: mx.array, n_segments: int, nonempty=None):
    """``out[s] = max of values[i] with segments[i] == s``; (n_segments, C).

    The value is gathered from the winning row (the lowest row index among
    ties), so the gradient flows to exactly one row per segment and channel.
    Empty segments give 0. A NaN in a segment makes that output NaN (with no
    gradient). ``nonempty``: optional (n_segments,) bool NumPy mask of
    segments known to hold rows, to skip a count.
    """
    n, c = values.shape
    if n_segments == 0 or n == 0:
        return mx.zeros((n_segments, c), dtype=values.dtype)
    rows, found = segment_argmax(values, segments, n_segments)
    y = mx.take_along_axis(values, rows, axis=0)
    if nonempty is None:
        nonempty = np.bincount(np.array(segments), minlength=n_segments) > 0
    nonempty = mx.array(np.asarray(nonempty, dtype=bool))[:, None]
    # Segments without a winner: empty (0) or containing a NaN (NaN).
    fallback = mx.where(nonempty, mx.array(np.nan, dtype=values.dtype), mx.array(0, dtype=values.dtype))
    return mx.where(found, y, fallback)
