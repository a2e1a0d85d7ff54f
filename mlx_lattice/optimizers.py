"""Optimizers with a fused CPU update.

``Adam`` and ``AdamW`` are ``mlx.optimizers.Adam`` / ``AdamW`` (same
arguments, state layout ``{"step", "learning_rate", <param>: {"m", "v"}}``,
schedules, ``init`` / ``update`` / ``apply_gradients``, saving and loading
state). On the CPU a float32 parameter is updated by one multithreaded
primitive that reads the parameter, its gradient and both moments once and
writes the three results, where MLX runs about a dozen elementwise ops with a temporary each. The
results are bitwise those of the MLX optimizers: every step rounds to
float32 in MLX's order. Other dtypes and GPU streams take MLX's update.

    import mlx_lattice.optimizers as optim
    opt = optim.Adam(learning_rate=1e-3)
    opt.update(model, grads)
"""

from __future__ import annotations

import mlx.core as mx
import mlx.optimizers as mopt

from . import _ext, routes


def _fusable(gradient: mx.array, parameter: mx.array, state: dict) -> bool:
    return (
        routes.current_backend() == "cpu"
        and gradient.dtype == mx.float32
        and parameter.dtype == mx.float32
        and state["m"].dtype == mx.float32
        and state["v"].dtype == mx.float32
        and gradient.shape == parameter.shape
    )


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

    def apply_single(self, gradient: mx.array, parameter: mx.array, state: dict):
        if not _fusable(gradient, parameter, state):
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
    """``mlx.optimizers.Adam`` with the fused CPU update (module doc)."""


class AdamW(_FusedAdam, mopt.AdamW):
    """``mlx.optimizers.AdamW`` with the fused CPU update (module doc)."""

    @property
    def _decay(self):
        return self.weight_decay


__all__ = ["Adam", "AdamW"]
