"""Segment reductions on MLX arrays (rows grouped by an integer segment id).

Built from gathers, scatters and elementwise ops only, so MLX differentiates
them (VJP and JVP) and ``mx.compile`` traces them. Shared by pooling,
voxelization and the per-sample normalisation layers.
"""

from __future__ import annotations

import numpy as np
import mlx.core as mx


def accumulation_dtype(dtype):
    """Sums of half-precision features are accumulated in float32."""
    return mx.float32 if dtype in (mx.float16, mx.bfloat16) else dtype


def segment_sum(values: mx.array, segments: mx.array, n_segments: int) -> mx.array:
    """``out[s] = sum of values[i] with segments[i] == s``; (n_segments, C).

    Accumulates in float32 for half-precision values and returns that dtype;
    callers cast back. The scatter adds rows in row order on the CPU. MLX has
    no forward-mode rule for scatters, so this (linear) map carries its own:
    the JVP is the same segment sum of the tangent, the VJP a gather.
    """
    acc = accumulation_dtype(values.dtype)
    shape = (n_segments, values.shape[1])
    if values.shape[0] == 0:
        return mx.zeros(shape, dtype=acc)

    @mx.custom_function
    def scatter_sum(v, seg):
        # stop_gradient keeps MLX's forward-mode pass from visiting the
        # scatter itself; the rules below define both derivatives.
        return mx.zeros(shape, dtype=v.dtype).at[seg].add(mx.stop_gradient(v))

    @scatter_sum.vjp
    def scatter_sum_vjp(primals, cotangent, output):
        v, seg = primals
        return cotangent[seg].astype(v.dtype), mx.zeros_like(seg)

    @scatter_sum.jvp
    def scatter_sum_jvp(primals, tangents):
        v, seg = primals
        return mx.zeros(shape, dtype=v.dtype).at[seg].add(tangents[0].astype(v.dtype))

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
