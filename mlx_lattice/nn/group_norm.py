"""Group normalisation of voxel features, per batch item."""

from __future__ import annotations

import numpy as np
import mlx.core as mx
import mlx.nn as mnn

from .._segment import accumulation_dtype, segment_sum
from ..tensor import SparseTensor


class GroupNorm(mnn.Module):
    """Normalise each group of channels over the voxels of each batch item.

    ``GroupNorm(num_groups, num_channels)``: the channels split into
    ``num_groups`` consecutive groups of ``num_channels // num_groups``; for
    batch item ``b`` and group ``g`` the mean and biased variance run over
    every voxel of ``b`` and every channel of ``g`` (``torch.nn.GroupNorm``
    on the dense grid, counting active voxels only). Then the per-channel
    affine ``weight``/``bias``. Statistics in float32 for half-precision
    features; no running state. ``num_groups == num_channels`` is
    :class:`InstanceNorm`; ``num_groups == 1`` normalises a whole sample.
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        super().__init__()
        if num_groups < 1 or num_channels < 1 or num_channels % num_groups:
            raise ValueError(
                f"num_channels ({num_channels}) must be a positive multiple of num_groups ({num_groups})"
            )
        if eps <= 0:
            raise ValueError(f"eps must be positive, got {eps}")
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        if affine:
            self.weight = mx.ones((num_channels,))
            self.bias = mx.zeros((num_channels,))

    def _extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={'weight' in self}"

    def __call__(self, x: SparseTensor) -> SparseTensor:
        if not isinstance(x, SparseTensor):
            raise TypeError("GroupNorm needs a SparseTensor (its batch column groups the voxels)")
        f = x.feats
        n, c = f.shape
        if c != self.num_channels:
            raise ValueError(f"GroupNorm({self.num_groups}, {self.num_channels}) got {c} channels")
        if n == 0:
            return x
        g = self.num_groups
        counts = x.batch_counts
        b = x.coords[:, 0]
        inv_n = mx.array((1.0 / (np.maximum(counts, 1) * (c // g))).astype(np.float32))[:, None]
        xf = f.astype(accumulation_dtype(f.dtype)).reshape(n, g, c // g)
        mean = segment_sum(xf.sum(axis=2), b, len(counts)) * inv_n  # (B, G)
        centred = xf - mean[b][:, :, None]
        var = segment_sum((centred * centred).sum(axis=2), b, len(counts)) * inv_n
        y = (centred * mx.rsqrt(var + self.eps)[b][:, :, None]).reshape(n, c)
        if "weight" in self:
            y = y * self.weight + self.bias
        return x.replace(y.astype(f.dtype))
