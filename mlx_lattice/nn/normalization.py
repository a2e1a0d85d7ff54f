"""Normalisation layers over voxel features.

``BatchNorm`` pools statistics over every voxel of every batch item (as
TorchSparse / MinkowskiEngine batch norms do); ``InstanceNorm`` over the
voxels of each batch item separately; ``LayerNorm`` and ``RMSNorm`` normalise
each voxel's channels. All accept SparseTensors and plain arrays.
"""

from __future__ import annotations

import numpy as np
import mlx.core as mx
import mlx.nn as mnn

from .._segment import accumulation_dtype, segment_sum
from ..tensor import SparseTensor
from ._feature import on_features


class BatchNorm(mnn.Module):
    """Batch normalisation of features ``(N, C)`` over all N voxels.

    Same parameters, state and update rule as ``mlx.nn.BatchNorm``: learned
    ``weight``/``bias``; ``running_mean``/``running_var`` (frozen, saved
    with the weights) updated in training mode with ``momentum`` from the
    batch mean and the unbiased batch variance, and used in eval mode
    (``model.eval()``). Training normalises with the biased batch variance.
    Statistics are computed in float32. A tensor with no rows passes through
    unchanged; one with a single row leaves the running statistics alone.
    Under ``mx.compile`` in training mode, pass ``model.state`` as the
    compiled function's inputs and outputs (as for ``mlx.nn.BatchNorm``).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True):
        super().__init__()
        if eps <= 0:
            raise ValueError(f"eps must be positive, got {eps}")
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = mx.ones((num_features,))
            self.bias = mx.zeros((num_features,))
        if track_running_stats:
            self.running_mean = mx.zeros((num_features,))
            self.running_var = mx.ones((num_features,))
            self.freeze(keys=["running_mean", "running_var"], recurse=False)

    def unfreeze(self, *args, **kwargs):
        super().unfreeze(*args, **kwargs)
        if self.track_running_stats:
            self.freeze(keys=["running_mean", "running_var"], recurse=False)
        return self

    def _extra_repr(self):
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
            f"affine={'weight' in self}, track_running_stats={self.track_running_stats}"
        )

    def _normalise(self, f: mx.array) -> mx.array:
        n = f.shape[0]
        if f.ndim != 2 or f.shape[1] != self.num_features:
            raise ValueError(f"BatchNorm({self.num_features}) got features of shape {tuple(f.shape)}")
        if n == 0:
            return f
        acc = accumulation_dtype(f.dtype)
        x = f.astype(acc)
        if self.training or not self.track_running_stats:
            mean = x.mean(axis=0)
            centred = x - mean
            sq = (centred * centred).sum(axis=0)
            var = sq / n
            if self.training and self.track_running_stats and n > 1:
                mu = self.momentum
                self.running_mean = (1 - mu) * self.running_mean + mu * mx.stop_gradient(mean)
                self.running_var = (1 - mu) * self.running_var + mu * mx.stop_gradient(sq / (n - 1))
        else:
            mean, var = self.running_mean, self.running_var
            centred = x - mean
        y = centred * mx.rsqrt(var + self.eps)
        if "weight" in self:
            y = y * self.weight + self.bias
        return y.astype(f.dtype)

    def __call__(self, x):
        return on_features(x, self._normalise)


class InstanceNorm(mnn.Module):
    """Normalise each channel over the voxels of each batch item separately.

    ``y = (x - mean_b) / sqrt(var_b + eps) * weight + bias`` with the mean and
    biased variance of the voxel's own batch item (statistics per sample, as
    generative models over variable-size scenes expect); no running state.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        if affine:
            self.weight = mx.ones((num_features,))
            self.bias = mx.zeros((num_features,))

    def _extra_repr(self):
        return f"{self.num_features}, eps={self.eps}, affine={'weight' in self}"

    def __call__(self, x: SparseTensor) -> SparseTensor:
        if not isinstance(x, SparseTensor):
            raise TypeError("InstanceNorm needs a SparseTensor (its batch column groups the voxels)")
        f = x.feats
        if f.shape[0] == 0:
            return x
        counts = x.batch_counts
        n_b = len(counts)
        b = x.coords[:, 0]
        inv_n = mx.array((1.0 / np.maximum(counts, 1)).astype(np.float32))[:, None]
        acc = accumulation_dtype(f.dtype)
        xf = f.astype(acc)
        mean = segment_sum(xf, b, n_b) * inv_n
        centred = xf - mean[b]
        var = segment_sum(centred * centred, b, n_b) * inv_n
        y = centred * mx.rsqrt(var + self.eps)[b]
        if "weight" in self:
            y = y * self.weight + self.bias
        return x.replace(y.astype(f.dtype))


class LayerNorm(mnn.LayerNorm):
    """``mlx.nn.LayerNorm`` over each voxel's channels (same parameters)."""

    def __call__(self, x):
        return on_features(x, super().__call__)


class RMSNorm(mnn.RMSNorm):
    """``mlx.nn.RMSNorm`` over each voxel's channels (same parameters)."""

    def __call__(self, x):
        return on_features(x, super().__call__)
