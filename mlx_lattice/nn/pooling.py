"""Pooling layers (see :mod:`mlx_lattice.pooling` for the semantics)."""

from __future__ import annotations

import mlx.nn as mnn

from .. import pooling
from .._args import triple


class _LocalPool(mnn.Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1):
        super().__init__()
        self.kernel_size = triple(kernel_size, "kernel_size", minimum=1)
        self.stride = self.kernel_size if stride is None else triple(stride, "stride", minimum=1)
        self.padding = triple(padding, "padding", minimum=0)
        self.dilation = triple(dilation, "dilation", minimum=1)

    def _extra_repr(self):
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, dilation={self.dilation}"
        )

    def _args(self):
        return self.kernel_size, self.stride, self.padding, self.dilation


class MaxPool3d(_LocalPool):
    """:func:`mlx_lattice.pooling.max_pool3d`; stride defaults to the kernel size."""

    def __call__(self, x):
        return pooling.max_pool3d(x, *self._args())


class AvgPool3d(_LocalPool):
    """:func:`mlx_lattice.pooling.avg_pool3d`; stride defaults to the kernel size."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, count_empty=False):
        super().__init__(kernel_size, stride, padding, dilation)
        self.count_empty = count_empty

    def __call__(self, x):
        return pooling.avg_pool3d(x, *self._args(), count_empty=self.count_empty)


class SumPool3d(_LocalPool):
    """:func:`mlx_lattice.pooling.sum_pool3d`; stride defaults to the kernel size."""

    def __call__(self, x):
        return pooling.sum_pool3d(x, *self._args())


class GlobalMaxPool(mnn.Module):
    """Per batch item maximum: SparseTensor -> ``(B, C)``, ``B = x.num_batches``
    (an empty item gives zeros)."""

    def __call__(self, x):
        return pooling.global_max_pool(x)


class GlobalAvgPool(mnn.Module):
    """Per batch item mean: SparseTensor -> ``(B, C)``, ``B = x.num_batches``
    (an empty item gives zeros)."""

    def __call__(self, x):
        return pooling.global_avg_pool(x)


class GlobalSumPool(mnn.Module):
    """Per batch item sum: SparseTensor -> ``(B, C)``, ``B = x.num_batches``
    (an empty item gives zeros)."""

    def __call__(self, x):
        return pooling.global_sum_pool(x)
