"""Normalisation layers over voxel features.

``BatchNorm`` pools statistics over every voxel of every batch item (as
TorchSparse / MinkowskiEngine batch norms do); ``InstanceNorm`` over the
voxels of each batch item separately; ``LayerNorm`` and ``RMSNorm`` normalise
each voxel's channels. All accept SparseTensors and plain arrays.

On the CPU and on a Metal GPU, ``BatchNorm`` and ``InstanceNorm`` run as one
fused primitive (statistics, normalisation, an optional residual add and a
ReLU / LeakyReLU: see :func:`norm_act`), with its own backward pass. On MLX's
CUDA backend the same contract runs as a few CUDA kernels
(``mlx_lattice.backends.cuda.norm``: three forward, one in eval mode, and three
backward, with a closed-form backward pass). With other activations they are
MLX ops.

``with fused_norms(False): ...`` runs them as MLX ops on every backend for
the block (benchmarks and tests compare the two paths); ``with
record_norms() as calls: ...`` collects each ``BatchNorm`` / ``InstanceNorm``
call of the block (module, input features, activation, residual, host time)
for profilers.
"""

from __future__ import annotations

import contextlib
import time
from typing import NamedTuple

import numpy as np
import mlx.core as mx
import mlx.nn as mnn

from .. import backends
from .._recorder import CallRecorder
from .._segment import accumulation_dtype, segment_sum
from ..tensor import SparseTensor
from ._feature import on_features
from .activations import LeakyReLU, ReLU

_FUSED_DTYPES = (mx.float32, mx.float16, mx.bfloat16)

# False runs the MLX-op path on the CPU / on Metal / on CUDA too (benchmarks
# and tests compare the two: fused_norms sets all three for a block).
FUSED_ON_CPU = True
FUSED_ON_METAL = True
FUSED_ON_CUDA = True


@contextlib.contextmanager
def fused_norms(enabled: bool):
    """Within the block, run ``BatchNorm`` / ``InstanceNorm`` fused where
    the activation allows (True: the default on the CPU, on Metal and on
    CUDA) or as MLX ops whatever the activation (False, on every backend);
    the previous setting returns when the block ends. Not thread-local: it
    holds for the whole process."""
    global FUSED_ON_CPU, FUSED_ON_METAL, FUSED_ON_CUDA
    old = FUSED_ON_CPU, FUSED_ON_METAL, FUSED_ON_CUDA
    FUSED_ON_CPU = FUSED_ON_METAL = FUSED_ON_CUDA = enabled
    try:
        yield
    finally:
        FUSED_ON_CPU, FUSED_ON_METAL, FUSED_ON_CUDA = old


class NormCall(NamedTuple):
    """One ``BatchNorm`` / ``InstanceNorm`` call (see :func:`record_norms`)."""

    norm: mnn.Module  # the module called
    x: mx.array  # its input features
    act: object  # the activation module passed (None: none)
    residual: mx.array | None  # the residual features passed
    host_s: float  # host seconds of the call (MLX runs the kernels later, at evaluation)


_norm_calls = CallRecorder()


def record_norms():
    """``with record_norms() as calls: ...`` collects a :class:`NormCall` for
    every ``BatchNorm`` and ``InstanceNorm`` call in the block (through
    :func:`norm_act` or directly), in call order; ``SyncBatchNorm`` is not
    recorded. Open blocks nest, each collecting every call."""
    return _norm_calls.record()


def _features(x):
    return x.feats if isinstance(x, SparseTensor) else x


def _fused_activation(act):
    """(code, slope) of the fused kernel for ``act``, or None if it has none."""
    if act is None or isinstance(act, mnn.Identity):
        return 0, 0.0
    if isinstance(act, ReLU):
        return 1, 0.0
    if isinstance(act, LeakyReLU) and act.negative_slope >= 0:
        return 2, float(act.negative_slope)
    return None


def _fusable(f: mx.array, act) -> bool:
    backend = backends.current()
    return (
        globals()[backend.fused_norm_switch]
        and backend.fused_norm_available()
        and f.dtype in _FUSED_DTYPES
        and _fused_activation(act) is not None
    )


def _fused_op():
    """The fused norm_act of the current backend (``_ext.norm_act``'s
    arguments and results)."""
    return backends.current().fused_norm()


def _affine(norm, c):
    if "weight" in norm:
        return norm.weight, norm.bias
    return mx.ones((c,), dtype=mx.float32), mx.zeros((c,), dtype=mx.float32)


def norm_act(norm, x, act=None, residual=None):
    """``act(norm(x) + residual)`` for a :class:`BatchNorm` or
    :class:`InstanceNorm` ``norm``, an activation module ``act`` (None for
    none) and an optional ``residual`` (same voxels and shape as x).

    On the CPU or a Metal GPU, with a ReLU, a LeakyReLU of slope >= 0 or no
    activation, the whole expression is one primitive (forward and backward;
    on the CPU multithreaded and bitwise identical across thread counts, on
    Metal in fixed summation orders); on CUDA a few kernels (fixed summation
    orders: bitwise identical run to run); otherwise the modules run one after
    another. All give the same values up to rounding.
    """
    if not isinstance(norm, (BatchNorm, InstanceNorm)):
        raise TypeError(f"norm_act: norm must be a BatchNorm or InstanceNorm, got {type(norm).__name__}")
    r = None
    if residual is not None:
        r = residual.feats if isinstance(residual, SparseTensor) else residual
        f = x.feats if isinstance(x, SparseTensor) else x
        if not isinstance(r, mx.array) or tuple(r.shape) != tuple(f.shape) or r.dtype != f.dtype:
            raise ValueError(
                f"norm_act: residual must match the features' shape {tuple(f.shape)} and dtype"
            )
    return norm(x, act=act, residual=r)


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

    def _normalise(self, f: mx.array, act=None, residual=None) -> mx.array:
        n = f.shape[0]
        if f.ndim != 2 or f.shape[1] != self.num_features:
            raise ValueError(f"BatchNorm({self.num_features}) got features of shape {tuple(f.shape)}")
        if n == 0:
            return f
        if _fusable(f, act):
            return self._fused(f, act, residual)
        y = self._reference(f, residual)
        return y if act is None else act(y)

    def _fused(self, f, act, residual):
        code, slope = _fused_activation(act)
        w, b = _affine(self, f.shape[1])
        n = f.shape[0]
        if self.training or not self.track_running_stats:
            rm, rv = (self.running_mean, self.running_var) if self.track_running_stats else (None, None)
            if self.training and rm is not None and n > 1 and rm.dtype == rv.dtype == mx.float32:
                mu = self.momentum
                y, self.running_mean, self.running_var = backends.current().norm_running(
                    f, w, b, residual, self.eps, code, slope, rm, rv, 1 - mu, mu, n / (n - 1))
                return y
            y, mean, var = _fused_op()(f, w, b, residual, None, 1, None, None, self.eps, code, slope)
            if self.training and self.track_running_stats and n > 1:
                self._update_running(mean, var, n)
            return y
        (y,) = _fused_op()(
            f, w, b, residual, None, 1, self.running_mean, self.running_var, self.eps, code, slope
        )
        return y

    def _update_running(self, mean, var, n):
        """running = (1 - momentum) * running + momentum * batch statistic
        (the variance unbiased), from the fused kernel's (1, C) statistics,
        for running statistics in another dtype than float32 (a model cast
        with set_dtype): MLX's expressions, once; their result is float32.
        Float32 ones are the backend's (``norm_running``: inside the norm's
        own primitive on the CPU, none of its own on CUDA, where the
        statistics' kernel forms them, with MLX's float32 roundings)."""
        mu = self.momentum
        rm, rv = self.running_mean, self.running_var
        mean, var = mx.stop_gradient(mean.reshape(-1)), mx.stop_gradient(var.reshape(-1))
        self.running_mean = (1 - mu) * rm + mu * mean
        self.running_var = (1 - mu) * rv + mu * (var * (n / (n - 1)))

    def _reference(self, f: mx.array, residual=None) -> mx.array:
        """The MLX-op path (activations the fused kernels lack, and comparisons);
        the residual is added before the one rounding to f's dtype, as the
        fused kernel does."""
        n = f.shape[0]
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
        if residual is not None:
            y = y + residual.astype(acc)
        return y.astype(f.dtype)

    def __call__(self, x, act=None, residual=None):
        """Normalise x; ``act`` and ``residual`` as in :func:`norm_act`."""
        t0 = time.perf_counter()
        y = on_features(x, lambda f: self._normalise(f, act, residual))
        if _norm_calls:
            _norm_calls.add(NormCall(self, _features(x), act, residual, time.perf_counter() - t0))
        return y


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

    def __call__(self, x: SparseTensor, act=None, residual=None) -> SparseTensor:
        """Normalise x; ``act`` and ``residual`` as in :func:`norm_act`."""
        t0 = time.perf_counter()
        y = self._normalise(x, act, residual)
        if _norm_calls:
            _norm_calls.add(NormCall(self, x.feats, act, residual, time.perf_counter() - t0))
        return y

    def _normalise(self, x, act, residual):
        if not isinstance(x, SparseTensor):
            raise TypeError("InstanceNorm needs a SparseTensor (its batch column groups the voxels)")
        f = x.feats
        if f.ndim != 2 or f.shape[1] != self.num_features:
            raise ValueError(f"InstanceNorm({self.num_features}) got features of shape {tuple(f.shape)}")
        if f.shape[0] == 0:
            return x
        n_b = len(x.batch_counts)
        b = x.coords[:, 0]
        if _fusable(f, act):
            code, slope = _fused_activation(act)
            w, bias = _affine(self, f.shape[1])
            y, _, _ = _fused_op()(f, w, bias, residual, b, n_b, None, None, self.eps, code, slope)
            return x.replace(y)
        y = x.replace(self._reference(f, b, x.batch_counts, residual))
        return y if act is None else act(y)

    def _reference(self, f, b, counts, residual=None):
        """The MLX-op path (activations the fused kernels lack, and comparisons);
        the residual is added before rounding, as in BatchNorm."""
        n_b = len(counts)
        inv_n = mx.array((1.0 / np.maximum(counts, 1)).astype(np.float32))[:, None]
        acc = accumulation_dtype(f.dtype)
        xf = f.astype(acc)
        mean = segment_sum(xf, b, n_b) * inv_n
        centred = xf - mean[b]
        var = segment_sum(centred * centred, b, n_b) * inv_n
        y = centred * mx.rsqrt(var + self.eps)[b]
        if "weight" in self:
            y = y * self.weight + self.bias
        if residual is not None:
            y = y + residual.astype(acc)
        return y.astype(f.dtype)


class LayerNorm(mnn.LayerNorm):
    """``mlx.nn.LayerNorm`` over each voxel's channels (same parameters)."""

    def __call__(self, x):
        return on_features(x, super().__call__)


class RMSNorm(mnn.RMSNorm):
    """``mlx.nn.RMSNorm`` over each voxel's channels (same parameters)."""

    def __call__(self, x):
        return on_features(x, super().__call__)
