"""Activations and dropout on voxel features (SparseTensors or plain arrays)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as mnn

from ._feature import on_features


class ReLU(mnn.Module):
    def __call__(self, x):
        return on_features(x, mnn.relu)


class LeakyReLU(mnn.Module):
    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def _extra_repr(self):
        return f"negative_slope={self.negative_slope}"

    def __call__(self, x):
        return on_features(x, lambda f: mnn.leaky_relu(f, self.negative_slope))


class GELU(mnn.Module):
    """``approx``: 'none' (erf), 'precise'/'tanh' or 'fast', as ``mlx.nn.GELU``."""

    def __init__(self, approx: str = "none"):
        super().__init__()
        fns = {"none": mnn.gelu, "precise": mnn.gelu_approx, "tanh": mnn.gelu_approx, "fast": mnn.gelu_fast_approx}
        if approx not in fns:
            raise ValueError(f"approx must be one of {sorted(fns)}, got {approx!r}")
        self.approx = approx
        self._fn = fns[approx]

    def _extra_repr(self):
        return f"approx={self.approx!r}"

    def __call__(self, x):
        return on_features(x, self._fn)


class SiLU(mnn.Module):
    def __call__(self, x):
        return on_features(x, mnn.silu)


class Sigmoid(mnn.Module):
    def __call__(self, x):
        return on_features(x, mx.sigmoid)


class Softplus(mnn.Module):
    """``log(1 + exp(beta * x)) / beta``, and ``x`` itself where
    ``beta * x > threshold`` (as ``torch.nn.Softplus``: the two agree to
    float precision there, and the linear branch cannot overflow)."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        if beta <= 0:
            raise ValueError(f"beta must be positive, got {beta}")
        self.beta = beta
        self.threshold = threshold

    def _extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"

    def _softplus(self, f):
        bx = f * self.beta
        # logaddexp(bx, 0) is log(1 + exp(bx)) without overflow.
        soft = mx.logaddexp(bx, mx.zeros_like(bx)) / self.beta
        return mx.where(bx > self.threshold, f, soft).astype(f.dtype)

    def __call__(self, x):
        return on_features(x, self._softplus)


class Tanh(mnn.Module):
    def __call__(self, x):
        return on_features(x, mx.tanh)


class Dropout(mnn.Dropout):
    """``mlx.nn.Dropout`` on the features: in training mode zeroes each
    feature with probability ``p`` and scales the rest by ``1 / (1 - p)``;
    the identity in eval mode."""

    def __call__(self, x):
        return on_features(x, super().__call__)


class FeatureMap(mnn.Module):
    """Wrap any array module or function to act on a SparseTensor's features.

    ``FeatureMap(mlx.nn.Mish())`` or ``FeatureMap(lambda f: f * 2)``; a wrapped
    module's parameters belong to this module (``self.fn``).
    """

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def __call__(self, x):
        return on_features(x, self.fn)
