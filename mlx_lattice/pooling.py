"""Pooling over active voxels.

Local pooling (``max_pool3d``, ``avg_pool3d``, ``sum_pool3d``) reads the same
receptive fields as :func:`mlx_lattice.ops.conv3d` with the same kernel size,
stride, padding and dilation, and writes to the same output support: every
``q`` with an active input at ``s*q - padding + dilation*d``, sorted by
``(batch, x, y, z)``. The relation comes from the tensor's
``CoordinateManager``, so a pooling layer and a convolution with the same
geometry share one map, and a later ``conv_transpose3d`` with this stride
lands back on the pooled tensor's voxels.

Only active voxels take part: a max is over the active inputs (an empty
voxel is not a zero), a sum adds the active inputs, and an average divides by
the number of active inputs (``count_empty=True`` divides by the kernel
volume instead, which is the dense average with zero padding).

Max ties: the winner is the input at the smallest flat kernel offset
``k = (dx * Ky + dy) * Kz + dz``, per channel; it alone receives the
gradient. Global max pooling gives ties to the lowest row index.

:func:`pool_transpose3d` (unpooling) is the adjoint of ``sum_pool3d``: each
coarse voxel's features go back to the fine voxels of its receptive field,
on the support :func:`mlx_lattice.ops.conv_transpose3d` would use.

Global pooling reduces each batch item to one row: ``(B, C)`` dense arrays
with ``B = x.num_batches``, one row per batch item in batch order; batch
items without voxels give zeros (sum, average and max alike). The batch
column alone cannot hold an empty last item: build the tensor with
``batch_counts=`` (``SparseTensor(coords, feats, batch_counts=[2, 0])``, or
:func:`mlx_lattice.sparse_collate`) and every tensor computed from it keeps
that batch size.

Everything is built from MLX gathers, scatters and elementwise ops, so
``mx.grad``, ``mx.vjp``, ``mx.jvp`` and ``mx.compile`` apply.
"""

from __future__ import annotations

import numpy as np
import mlx.core as mx

from ._args import triple
from ._segment import segment_max, segment_sum
from .relation import KernelGeometry
from .tensor import SparseTensor, target_set

__all__ = [
    "max_pool3d",
    "avg_pool3d",
    "sum_pool3d",
    "global_max_pool",
    "global_avg_pool",
    "global_sum_pool",
    "pool_transpose3d",
]


def _check(op, x):
    if not isinstance(x, SparseTensor):
        raise TypeError(f"{op}: x must be a SparseTensor, got {type(x).__name__}")


def _geometry(kernel_size, stride, padding, dilation) -> KernelGeometry:
    ks = triple(kernel_size, "kernel_size", minimum=1)
    st = ks if stride is None else triple(stride, "stride", minimum=1)
    return KernelGeometry(
        ks, st, triple(padding, "padding", minimum=0), triple(dilation, "dilation", minimum=1)
    )


def _is_identity(geom: KernelGeometry) -> bool:
    return geom.kernel_size == (1, 1, 1) and geom.stride == (1, 1, 1) and geom.padding == (0, 0, 0)


def _relation(x: SparseTensor, geom: KernelGeometry):
    rel, out_set = x.manager.kernel_relation(x.coordinate_set, geom)
    return rel, out_set


def sum_pool3d(x: SparseTensor, kernel_size, stride=None, padding=0, dilation=1) -> SparseTensor:
    """Sum of the active inputs in each receptive field.

    ``stride`` defaults to ``kernel_size``. Output support and row order as
    :func:`mlx_lattice.ops.conv3d` with this geometry.
    """
    _check("sum_pool3d", x)
    geom = _geometry(kernel_size, stride, padding, dilation)
    if _is_identity(geom):
        return x
    rel, out_set = _relation(x, geom)
    y = segment_sum(x.feats[rel.in_idx], rel.out_idx, rel.n_out)
    return SparseTensor._from_set(out_set, y.astype(x.dtype), x.manager)


def avg_pool3d(
    x: SparseTensor, kernel_size, stride=None, padding=0, dilation=1, *, count_empty=False
) -> SparseTensor:
    """Mean of the active inputs in each receptive field.

    ``count_empty=True`` divides by the kernel volume instead of the number
    of active inputs (the dense average pool with zero padding).
    """
    _check("avg_pool3d", x)
    geom = _geometry(kernel_size, stride, padding, dilation)
    if _is_identity(geom):
        return x
    rel, out_set = _relation(x, geom)
    y = segment_sum(x.feats[rel.in_idx], rel.out_idx, rel.n_out)
    if count_empty:
        y = y / geom.volume
    else:
        counts = np.diff(np.array(rel.out_offsets)).astype(np.float32)
        y = y / mx.array(np.maximum(counts, 1.0))[:, None]
    return SparseTensor._from_set(out_set, y.astype(x.dtype), x.manager)


def max_pool3d(x: SparseTensor, kernel_size, stride=None, padding=0, dilation=1) -> SparseTensor:
    """Maximum over the active inputs in each receptive field, per channel.

    Ties go to the input at the smallest flat kernel offset, which alone
    receives the gradient.
    """
    _check("max_pool3d", x)
    geom = _geometry(kernel_size, stride, padding, dilation)
    if _is_identity(geom):
        return x
    rel, out_set = _relation(x, geom)
    # Edges are sorted by (output row, kernel offset): the lowest edge index
    # among tied edges of one output is the smallest kernel offset.
    in_idx = rel.in_idx
    y_edges = segment_max(
        x.feats[in_idx], rel.out_idx, rel.n_out, nonempty=np.ones(rel.n_out, dtype=bool)
    )
    return SparseTensor._from_set(out_set, y_edges, x.manager)


def pool_transpose3d(
    x: SparseTensor, kernel_size=2, stride=None, padding=0, dilation=1, *, coordinates=None
) -> SparseTensor:
    """Unpooling: ``y[s*p - padding + dilation*d] += x[p]`` for every kernel offset d.

    The transpose of :func:`sum_pool3d` with the same geometry (``stride``
    defaults to ``kernel_size``). With ``kernel_size == stride`` (the default
    shape) every fine voxel has one coarse parent and receives a copy of its
    features: nearest-neighbour unpooling. Output support as
    :func:`mlx_lattice.ops.conv_transpose3d`: ``coordinates`` when given
    (fine voxels no coarse voxel reaches get zeros), else the finer set a
    pooling or strided convolution with this geometry came from (so
    ``pool_transpose3d(max_pool3d(x, 2), 2)`` lands on ``x``'s rows), else
    ``s * p`` for every input ``p``. Output tensor stride ``x.stride / s``.
    """
    _check("pool_transpose3d", x)
    geom = _geometry(kernel_size, stride, padding, dilation)
    dst = None
    if coordinates is not None:
        out_stride = tuple(a // b if a % b == 0 else 1 for a, b in zip(x.stride, geom.stride))
        dst = target_set(x, coordinates, out_stride)
    rel, dst = x.manager.transposed_kernel_relation(x.coordinate_set, geom, dst)
    y = segment_sum(x.feats[rel.in_idx], rel.out_idx, rel.n_out)
    return SparseTensor._from_set(dst, y.astype(x.dtype), x.manager)


# ---------------------------------------------------------------- global
def _batch_index(x: SparseTensor):
    counts = x.batch_counts
    return x.coords[:, 0], len(counts), counts


def global_sum_pool(x: SparseTensor) -> mx.array:
    """Per batch item, the sum of its voxels' features: ``(B, C)`` with
    ``B = x.num_batches`` (0 for an empty item)."""
    _check("global_sum_pool", x)
    b, n_b, _ = _batch_index(x)
    return segment_sum(x.feats, b, n_b).astype(x.dtype)


def global_avg_pool(x: SparseTensor) -> mx.array:
    """Per batch item, the mean of its voxels' features: ``(B, C)`` with
    ``B = x.num_batches`` (0 for an empty item)."""
    _check("global_avg_pool", x)
    b, n_b, counts = _batch_index(x)
    s = segment_sum(x.feats, b, n_b)
    return (s / mx.array(np.maximum(counts, 1).astype(np.float32))[:, None]).astype(x.dtype)


def global_max_pool(x: SparseTensor) -> mx.array:
    """Per batch item, the maximum of its voxels' features: ``(B, C)`` with
    ``B = x.num_batches``. An empty item gives 0 (not -inf), with no gradient.

    Ties go to the lowest row index, which alone receives the gradient.
    """
    _check("global_max_pool", x)
    b, n_b, counts = _batch_index(x)
    return segment_max(x.feats, b, n_b, nonempty=counts > 0)
