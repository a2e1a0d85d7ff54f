"""The MinkUNet training step the benches, profiles and the tuner time:
maps built inside every step, forward, loss, backward and an Adam update;
its useful FLOPs, and the same step with the update as MLX ops."""

from __future__ import annotations

import numpy as np
import mlx.core as mx
import mlx.nn as mnn

from .. import diagnostics
from .. import optimizers as optim
from ..models import MinkUNet
from ..tensor import SparseTensor


def loss_fn(model, x):
    # mx.square, not ** 2: the same bits, and MLX's Power calls powf per
    # element in both passes (3 ms a step at 97k rows).
    return mx.square(model(x).feats.astype(mx.float32)).mean()


class TrainingStep:
    """One MinkUNet training step on fixed coordinates; every call builds the
    coordinate manager and all maps afresh (as a data loader's new sample)."""

    def __init__(self, coords, width=0.5, dtype=mx.float32, in_channels=4, num_classes=4, seed=2,
                 optimizer=optim.Adam, master_weights=False, compiled=None):
        mx.random.seed(seed)
        self.coords = np.asarray(coords)
        self.model = MinkUNet(in_channels, num_classes, width=width)
        if dtype != mx.float32:
            self.model.set_dtype(dtype)
        feats = np.random.default_rng(seed).standard_normal((len(coords), in_channels))
        self.feats = mx.array(feats.astype(np.float32)).astype(dtype)
        self.optimizer_cls = optimizer
        # master_weights: a half-precision model trains on float32 master
        # weights (optimizers.MixedPrecision), so that its values stay finite
        # over many steps (plain Adam on float16 parameters turns NaN within
        # a few); off by default, as the spconv side's step (torch Adam on
        # the half parameters) is timed against this one.
        opt = optimizer(learning_rate=1e-3)
        self.optimizer = optim.MixedPrecision(opt) if master_weights and dtype != mx.float32 else opt
        self.loss_grad = mnn.value_and_grad(self.model, loss_fn)
        # compiled: the optimizer's update under mx.compile
        # (optimizers.compiled_update), by default on GPUs, where it fuses
        # each parameter's update into one kernel; the CPU's Adam update is
        # already one fused primitive per parameter.
        if compiled is None:
            compiled = mx.default_device() == mx.gpu
        self.compiled = compiled
        self.update = optim.compiled_update(self.model, self.optimizer) if compiled else self.eager_update
        mx.eval(self.model.parameters(), self.feats)

    def eager_update(self, grads):
        self.optimizer.update(self.model, grads)

    def tensor(self) -> SparseTensor:
        return SparseTensor(self.coords, self.feats)

    def __call__(self):
        loss, grads = self.loss_grad(self.model, self.tensor())
        self.update(grads)
        mx.eval(loss, self.model.state, self.optimizer.state)
        return loss


def useful_flops(step: TrainingStep) -> float:
    """Useful FLOPs of one training step (all convolution passes), counted
    from the route records of a forward pass, so on every backend: 2 * edges
    * C_in * C_out / groups per pass, and no input gradient for the first
    convolution (it reads the network's input features)."""
    with diagnostics.record() as log:
        step.model(step.tensor())
    total, first = 0.0, True
    for e in log:
        if e.get("direction") != "forward":
            continue
        fl = 2.0 * e["edges"] * e["c_in"] * e["c_out"] / max(e.get("groups") or 1, 1)
        total += fl * (2 if first else 3)
        first = False
    return total


def eager_update_step(step):
    """The same training step with the optimizer's update as MLX ops
    (not compiled), whatever the step's own setting."""

    def run():
        loss, grads = step.loss_grad(step.model, step.tensor())
        step.eager_update(grads)
        mx.eval(loss, step.model.state, step.optimizer.state)
        return loss

    return run
