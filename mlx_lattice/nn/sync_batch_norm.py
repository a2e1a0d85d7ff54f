"""Batch normalisation with statistics shared by every process of a group.

Under data parallelism each rank sees a ragged slice of the batch (its own
scenes, its own voxel count). ``SyncBatchNorm`` normalises with the mean and
variance of the union of those slices, exchanged through
``mx.distributed.all_sum``, so a step on R ranks computes what
:class:`BatchNorm` computes on the concatenated batch in one process.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as mnn

from .._segment import accumulation_dtype
from ._feature import on_features
from .normalization import BatchNorm

__all__ = ["SyncBatchNorm", "convert_sync_batchnorm"]


def _all_sum(x: mx.array, group) -> mx.array:
    return x if group.size() == 1 else mx.distributed.all_sum(x, group=group)


def _column_sums(x: mx.array) -> mx.array:
    # no reduction over an empty array: on MLX 0.32's CPU backend one can
    # leave a later all-reduce waiting forever
    return x.sum(axis=0) if x.shape[0] else mx.zeros((x.shape[1],), x.dtype)


def _global_stats(x: mx.array, group):
    """Global voxel count, mean and biased variance of ``x`` (n, C) over the group.

    Two exchanges: count and sums, then the sums of squares about the global
    mean (the count travels as a float: exact up to 2**24 voxels in float32). The second pass costs one more all-reduce of C values but keeps
    float32 accurate when the mean is large against the spread, and it is the
    same arithmetic as :class:`BatchNorm` on one process.
    """
    head = mx.concatenate([mx.array([x.shape[0]], dtype=x.dtype), _column_sums(x)])
    head = _all_sum(head, group)
    n = head[0]
    mean = head[1:] / mx.maximum(n, 1)
    centred = x - mean
    # the second exchange waits for the first on every rank: with no rows
    # the local sum would not depend on it, and two exchanges in flight at
    # once can pair up wrongly across ranks
    sq = _all_sum(mx.depends(_column_sums(centred * centred), head), group)
    return n, mean, sq


def _normalise_fn(group):
    """``(x - mean) * inv_std * scale + shift`` whose VJP treats mean and
    inv_std as the global statistics of ``x``: the two per-channel cotangent
    reductions are summed over the group, so each rank gets its rows' share
    of the gradient of the sum of every rank's loss. ``scale``/``shift``
    get this rank's (local) gradients."""

    @mx.custom_function
    def normalise(x, scale, shift, mean, inv_std, n):
        return (x - mean) * inv_std * scale + shift

    @normalise.vjp
    def normalise_vjp(primals, cotangent, output):
        x, scale, shift, mean, inv_std, n = primals
        xhat = (x - mean) * inv_std
        g = cotangent
        d_shift = _column_sums(g)
        d_scale = _column_sums(g * xhat)
        sums = _all_sum(mx.concatenate([d_shift, d_scale]), group)
        c = x.shape[1]
        mean_g = sums[:c] / n
        mean_gx = sums[c:] / n
        dx = (g - mean_g - xhat * mean_gx) * (inv_std * scale)
        # a rank with no rows still takes part in the exchange: its (empty)
        # dx may be dropped from the graph, its parameter gradients are not
        d_scale, d_shift = mx.depends([d_scale, d_shift], [sums])
        return dx, d_scale, d_shift, mx.zeros_like(mean), mx.zeros_like(inv_std), mx.zeros_like(n)

    return normalise


class SyncBatchNorm(BatchNorm):
    """:class:`BatchNorm` whose batch statistics span every rank of ``group``.

    In training mode (and in eval mode without running statistics) the
    global voxel count, per-channel sums and sums of squares about the
    global mean are all-summed over ``group`` (default: the global group of
    ``mx.distributed.init()``); the backward pass all-sums the two
    per-channel cotangent reductions it needs. Running statistics are
    updated from the global mean and unbiased global variance, so they stay
    identical on every rank. Eval mode with running statistics is local (no
    communication). With one process, or no distributed backend, it is
    exactly :class:`BatchNorm`.

    The exchanges are collective: every rank must call the layer the same
    number of times, including ranks whose slice has no voxels (they
    contribute zero counts and get an empty output).

    Gradients are those of the sum of every rank's loss: with
    ``mlx.nn.average_gradients`` dividing by the group size, each rank's
    loss should be ``size`` times its share of the global loss (see
    :func:`mlx_lattice.distributed.global_mean`).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True, group=None):
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine,
                         track_running_stats=track_running_stats)
        self.group = group

    def _group(self):
        return self.group if self.group is not None else mx.distributed.init()

    def _normalise(self, f: mx.array, act=None, residual=None) -> mx.array:
        if f.ndim != 2 or f.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm({self.num_features}) got features of shape {tuple(f.shape)}")
        if self.training or not self.track_running_stats:
            y = self._synced(f)
        else:
            y = super()._normalise(f)
        # residual add and activation as separate ops (``act(norm(x) + residual)``)
        if residual is not None:
            y = y + residual
        return y if act is None else act(y)

    def _synced(self, f: mx.array) -> mx.array:
        group = self._group()
        x = f.astype(accumulation_dtype(f.dtype))
        n, mean, sq = _global_stats(mx.stop_gradient(x), group)
        var = sq / mx.maximum(n, 1)
        inv_std = mx.rsqrt(var + self.eps)
        if self.training and self.track_running_stats:
            mu = self.momentum
            # a global batch of one voxel leaves the running statistics alone
            keep = n <= 1
            new_mean = (1 - mu) * self.running_mean + mu * mean
            new_var = (1 - mu) * self.running_var + mu * sq / mx.maximum(n - 1, 1)
            self.running_mean = mx.where(keep, self.running_mean, new_mean)
            self.running_var = mx.where(keep, self.running_var, new_var)
        # no early return for an empty slice: the backward exchange must run on every rank
        if "weight" in self:
            scale, shift = self.weight, self.bias
        else:
            scale, shift = mx.ones((self.num_features,), x.dtype), mx.zeros((self.num_features,), x.dtype)
        y = _normalise_fn(group)(x, scale, shift, mean, inv_std, n)
        return y.astype(f.dtype)

    def __call__(self, x, act=None, residual=None):
        """Normalise x, then add ``residual`` (features of x's shape) and
        apply ``act`` (an activation module), each when given."""
        return on_features(x, lambda f: self._normalise(f, act, residual))

    @classmethod
    def from_batch_norm(cls, bn: BatchNorm, group=None) -> "SyncBatchNorm":
        """A SyncBatchNorm with ``bn``'s settings, parameters, running
        statistics and training mode."""
        out = cls(bn.num_features, eps=bn.eps, momentum=bn.momentum, affine="weight" in bn,
                  track_running_stats=bn.track_running_stats, group=group)
        for key in ("weight", "bias", "running_mean", "running_var"):
            if key in bn:
                out[key] = bn[key]
        out.train(bn.training)
        return out


def convert_sync_batchnorm(module: mnn.Module, group=None) -> mnn.Module:
    """Replace every :class:`BatchNorm` inside ``module`` by a
    :class:`SyncBatchNorm` over ``group`` carrying the same state; returns
    ``module`` (or the replacement when ``module`` itself is a BatchNorm).
    Layers that already are SyncBatchNorm are left as they are."""

    def convert(m):
        if isinstance(m, SyncBatchNorm):
            return m
        if isinstance(m, BatchNorm):
            return SyncBatchNorm.from_batch_norm(m, group)
        if isinstance(m, mnn.Module):
            for key, value in list(m.items()):
                new = convert(value)
                if new is not value:
                    m[key] = new
            return m
        if isinstance(m, (list, tuple)):
            items = [convert(v) for v in m]
            if any(a is not b for a, b in zip(items, m)):
                return type(m)(items) if isinstance(m, tuple) else items
            if isinstance(m, list):
                m[:] = items
            return m
        if isinstance(m, dict):
            for key, value in list(m.items()):
                m[key] = convert(value)
            return m
        return m

    return convert(module)
