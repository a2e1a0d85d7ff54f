"""Layers for sparse generative decoders (see :mod:`mlx_lattice.decoder`)."""

from __future__ import annotations

import mlx.nn as mnn

from .. import decoder, pooling
from .._args import triple
from .pooling import _LocalPool


class PoolTranspose3d(_LocalPool):
    """:func:`mlx_lattice.pooling.pool_transpose3d` (unpooling); stride
    defaults to the kernel size. ``layer(x, coordinates=None)``."""

    def __call__(self, x, coordinates=None):
        return pooling.pool_transpose3d(x, *self._args(), coordinates=coordinates)


class Upsample(mnn.Module):
    """Trilinear interpolation onto a finer coordinate set:
    ``layer(x, coordinates)``, see :func:`mlx_lattice.decoder.upsample`."""

    def __call__(self, x, coordinates, stride=None):
        return decoder.upsample(x, coordinates, stride=stride)


class Expand(mnn.Module):
    """Each voxel to its ``stride^3`` children (:func:`mlx_lattice.decoder.expand`)."""

    def __init__(self, stride=2):
        super().__init__()
        self.stride = triple(stride, "stride", minimum=1)

    def _extra_repr(self):
        return f"stride={self.stride}"

    def __call__(self, x):
        return decoder.expand(x, self.stride)


class Downsample(mnn.Module):
    """Coarsen by ``stride`` and reduce (:func:`mlx_lattice.decoder.downsample`)."""

    def __init__(self, stride=2, reduce="mean"):
        super().__init__()
        if reduce not in decoder._REDUCE:
            raise ValueError(f"reduce must be one of {sorted(decoder._REDUCE)}, got {reduce!r}")
        self.stride = triple(stride, "stride", minimum=1)
        self.reduce = reduce

    def _extra_repr(self):
        return f"stride={self.stride}, reduce={self.reduce!r}"

    def __call__(self, x):
        return decoder.downsample(x, self.stride, self.reduce)


class Prune(mnn.Module):
    """Keep voxels by occupancy logits: ``layer(x, logits, keep=None)``
    (``keep``: voxels kept whatever their logits, e.g. the targets in
    training), see :func:`mlx_lattice.decoder.prune_by_logits`."""

    def __init__(self, threshold=0.0, k=None):
        super().__init__()
        self.threshold = threshold
        self.k = k

    def _extra_repr(self):
        return f"threshold={self.threshold}, k={self.k}"

    def __call__(self, x, logits, keep=None):
        return decoder.prune_by_logits(x, logits, self.threshold, k=self.k, keep=keep)
