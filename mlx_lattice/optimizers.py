"""Optimizers with a fused update.

``Adam`` and ``AdamW`` are ``mlx.optimizers.Adam`` / ``AdamW`` (same
arguments, state layout ``{"step", "learning_rate", <param>: {"m", "v"}}``,
schedules, ``init`` / ``update`` / ``apply_gradients``, saving and loading
state). On the CPU a float32 parameter is updated by one multithreaded
primitive that reads the parameter, its gradient and both moments once and
writes the three results, where MLX runs about a dozen elementwise ops with a temporary each. The
results are bitwise those of the MLX optimizers: every step rounds to
float32 in MLX's order. Other dtypes on the CPU take MLX's update.

On a GPU stream (CUDA or Metal) every floating-point parameter is updated by
one ``mx.compile``d function of MLX's own update expression (one fused kernel
per parameter where MLX runs about two dozen primitives); the scalars of a
step (the learning rate cast to the gradient's dtype, the bias corrections,
AdamW's decay factor) are computed once per step and dtype with MLX's
expressions and passed in as arrays.

    import mlx_lattice.optimizers as optim
    opt = optim.Adam(learning_rate=1e-3)
    opt.update(model, grads)
"""

from __future__ import annotations

import mlx.core as mx
import mlx.optimizers as mopt

from . import _ext, routes


def _on_gpu() -> bool:
    return routes.current_backend() != "cpu"


def _fusable(gradient: mx.array, parameter: mx.array, state: dict) -> bool:
    return (
        not _on_gpu()
        and gradient.dtype == mx.float32
        and parameter.dtype == mx.float32
        and state["m"].dtype == mx.float32
        and state["v"].dtype == mx.float32
        and gradient.shape == parameter.shape
    )


_COMPILED = {}


def _compiled_update(b1: float, b2: float, eps: float, bias_correction: bool, decoupled: bool):
    """MLX's Adam (or with ``decoupled``, AdamW) update of one parameter as
    one compiled function, the Python constants baked in:
    ``(g, p, m, v, lr, c1, c2, decay) -> (p, m, v)`` with ``lr``, ``c1``,
    ``c2`` and ``decay`` (AdamW's ``1 - lr * weight_decay``) 0-d arrays in the
    gradient's dtype. Not shapeless: in shapeless mode every binary op carries a
    broadcast, which splits the expression over three kernels (MLX caps a
    fused kernel's depth); a parameter's shape is fixed, so each distinct
    shape and dtype is traced once."""
    key = (b1, b2, eps, bias_correction, decoupled)
    fn = _COMPILED.get(key)
    if fn is None:
        def update(g, p, m, v, lr, c1, c2, decay):
            if decoupled:
                p = p * decay
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * mx.square(g)
            if bias_correction:
                return p - (c1 * m) / (mx.sqrt(v) * c2 + eps), m, v
            return p - lr * m / (mx.sqrt(v) + eps), m, v

        fn = _COMPILED[key] = mx.compile(update)
    return fn


class _FusedAdam:
    """The fused update shared by Adam and AdamW (a mixin before the MLX class)."""

    _decay = 0.0

    def _step_scalars(self) -> mx.array:
        # The same MLX expressions as mlx.optimizers.Adam / AdamW, once per
        # step for all parameters (the step and learning-rate arrays are new
        # objects on every step): (lr or lr / (1 - b1^t), 1 / sqrt(1 - b2^t),
        # 1 - lr * decay).
        key = getattr(self, "_scalars_key", None)
        if key is None or key[0] is not self.step or key[1] is not self.learning_rate:
            self._scalars_key = (self.step, self.learning_rate)
            lr = self.learning_rate.astype(mx.float32)
            b1, b2 = self.betas
            one = mx.array(1.0, mx.float32)
            if self.bias_correction:
                step = self.step
                c1 = (lr / (1 - b1**step)).astype(mx.float32)
                c2 = mx.rsqrt(1 - b2**step).astype(mx.float32)
            else:
                c1, c2 = lr, one
            decay = (1 - lr * self._decay) if self._decay else one
            self._scalars = mx.stack([c1, c2, decay.astype(mx.float32)])
        return self._scalars

    def _gpu_scalars(self, dtype):
        # MLX's expressions for (lr, c1, c2, 1 - lr * weight_decay) in the
        # gradient's dtype, once per step and dtype.
        key = getattr(self, "_gpu_key", None)
        if key is None or key[0] is not self.step or key[1] is not self.learning_rate:
            self._gpu_key = (self.step, self.learning_rate)
            self._gpu_cache = {}
        out = self._gpu_cache.get(dtype)
        if out is None:
            # (unused entries are passed as lr: the compiled update ignores them)
            lr = c1 = c2 = decay = self.learning_rate.astype(dtype)
            if self.bias_correction:
                b1, b2 = self.betas
                c1 = (lr / (1 - b1**self.step)).astype(dtype)
                c2 = mx.rsqrt(1 - b2**self.step).astype(dtype)
            if isinstance(self, mopt.AdamW):
                decay = 1 - lr * self._decay
            out = self._gpu_cache[dtype] = (lr, c1, c2, decay)
        return out

    def _apply_compiled(self, gradient, parameter, state):
        b1, b2 = self.betas
        update = _compiled_update(
            b1, b2, self.eps, bool(self.bias_correction), isinstance(self, mopt.AdamW)
        )
        p, m, v = update(gradient, parameter, state["m"], state["v"], *self._gpu_scalars(gradient.dtype))
        state["m"] = m
        state["v"] = v
        return p

    def apply_single(self, gradient: mx.array, parameter: mx.array, state: dict):
        if not _fusable(gradient, parameter, state):
            if _on_gpu() and mx.issubdtype(gradient.dtype, mx.floating):
                return self._apply_compiled(gradient, parameter, state)
            return super().apply_single(gradient, parameter, state)
        b1, b2 = self.betas
        p, m, v = _ext.adam_update(
            gradient, parameter, state["m"], state["v"], self._step_scalars(),
            b1=b1, one_minus_b1=1 - b1, b2=b2, one_minus_b2=1 - b2, eps=self.eps,
            bias_correction=bool(self.bias_correction), decoupled_decay=bool(self._decay),
        )
        state["m"] = m
        state["v"] = v
        return p


class Adam(_FusedAdam, mopt.Adam):
    """``mlx.optimizers.Adam`` with the fused update (module doc)."""


class AdamW(_FusedAdam, mopt.AdamW):
    """``mlx.optimizers.AdamW`` with the fused update (module doc)."""

    @property
    def _decay(self):
        return self.weight_decay


__all__ = ["Adam", "AdamW"]
