"""Optimizers with a fused CPU update.

``Adam`` and ``AdamW`` are ``mlx.optimizers.Adam`` / ``AdamW`` (same
arguments, state layout ``{"step", "learning_rate", <param>: {"m", "v"}}``,
schedules, ``init`` / ``update`` / ``apply_gradients``, saving and loading
state). On the CPU float32 parameters are updated by multithreaded
primitives (sixteen parameters each: ``CPU_GROUP``) that read each
parameter, its gradient and both moments once and write the three results,
where MLX runs about a dozen elementwise ops with a temporary each. The
results are bitwise those of the MLX optimizers: every step rounds to
float32 in MLX's order. Other dtypes and Metal streams take MLX's update.

    import mlx_lattice.optimizers as optim
    opt = optim.Adam(learning_rate=1e-3)
    opt.update(model, grads)

On CUDA, ``Adam`` and ``AdamW`` update up to sixteen parameters of one
dtype and rank per kernel launch (``backends/cuda/adam.py``), where MLX
launches a kernel or more per parameter; float32 updates give the bits of
MLX's eager update.

``compiled_update(model, opt)`` is the same update under ``mx.compile``
(one fused kernel per parameter on Metal; on CUDA these classes' grouped
update as it is).

Half precision: Adam's ``eps`` (1e-8) and squared gradients underflow in
float16, so Adam on float16 parameters gives NaN within a step or two (these
classes warn once when asked to). :class:`MixedPrecision` wraps any
optimizer to keep float32 master weights and optimizer state for a float16
or bfloat16 model:

    model.set_dtype(mx.float16)
    opt = optim.MixedPrecision(optim.Adam(learning_rate=1e-3))
    loss, grads = mlx.nn.value_and_grad(model, loss_fn)(model, x)
    opt.update(model, grads)
"""

from __future__ import annotations

import warnings

import mlx.core as mx
import mlx.optimizers as mopt
from mlx.utils import tree_map

from . import _ext, backends


def _fusable(gradient: mx.array, parameter: mx.array, state: dict) -> bool:
    return (
        backends.current().fused_adam_update
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

    def apply_gradients(self, gradients: dict, parameters: dict):
        """MLX's ``apply_gradients``; on the CPU the float32 parameters go
        through fused primitives of ``CPU_GROUP`` parameters each
        (``_ext.adam_update_group``, each parameter's elements through the
        same kernel as ``apply_single``),
        on CUDA through ``backends.cuda.adam`` up to sixteen per launch (one
        dtype and rank each) instead of a kernel each."""
        backend = backends.current()
        kernels = backend.adam_kernels()
        if not backend.fused_adam_update and kernels is None:
            return super().apply_gradients(gradients, parameters)
        if not self._initialized:
            self.init(gradients)
        leaves: list = []
        slots: list = []
        tree = _gather(gradients, parameters, self.state, leaves, slots)
        if tree is None:  # not a tree of dicts and lists
            return super().apply_gradients(gradients, parameters)
        for param, scheduler in self._schedulers.items():
            self.state[param] = scheduler(self.step)
        self.state["step"] = self.step + 1
        if backend.fused_adam_update:
            done = _grouped_cpu_update(self, leaves)
        else:
            done = _grouped_kernel_update(self, leaves, kernels)
        for n, (p, m, v) in done.items():
            leaves[n][2]["m"], leaves[n][2]["v"] = m, v
            container, key = slots[n]
            container[key] = p
        # any other parameter (a dtype or shape the kernel does not take): MLX's update
        for n, (g, p, s) in enumerate(leaves):
            if n not in done:
                container, key = slots[n]
                container[key] = self.apply_single(g, p, s)
        return tree

    def _warn_float16(self, parameter):
        if parameter.dtype == mx.float16 and not getattr(self, "_warned_float16", False):
            self._warned_float16 = True
            warnings.warn(
                f"{type(self).__name__}: updating float16 parameters; eps={self.eps:g} and the squared "
                "gradients underflow in float16, which turns the update into NaN within a few steps. "
                "Keep float32 master weights: mlx_lattice.optimizers.MixedPrecision("
                f"{type(self).__name__}(...)) (docs/mixed_precision.md)",
                stacklevel=4,
            )

    def apply_single(self, gradient: mx.array, parameter: mx.array, state: dict):
        self._warn_float16(parameter)
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


# Parameters per CPU update primitive. MLX gives each output of a primitive
# every input and every other output (siblings), so building one primitive
# of n parameters costs the host O(n^2): 149 parameters in one took 3.3 ms
# to build, in groups of 16 0.4 ms.
CPU_GROUP = 16


def _grouped_cpu_update(opt, leaves) -> dict:
    """{leaf index: (parameter, m, v)} of every float32 leaf of ``leaves``
    ((gradient, parameter, state) each), updated by one CPU primitive per
    ``CPU_GROUP`` of them."""
    f32 = mx.float32  # _fusable's test, the backend being the CPU already
    grouped = [n for n, (g, p, s) in enumerate(leaves)
               if g.dtype == p.dtype == s["m"].dtype == s["v"].dtype == f32 and g.shape == p.shape]
    b1, b2 = opt.betas
    scalars = opt._step_scalars() if grouped else None
    done = {}
    for i in range(0, len(grouped), CPU_GROUP):
        part = grouped[i:i + CPU_GROUP]
        flat = _ext.adam_update_group(
            [leaves[n][0] for n in part], [leaves[n][1] for n in part],
            [leaves[n][2]["m"] for n in part], [leaves[n][2]["v"] for n in part], scalars,
            b1=b1, one_minus_b1=1 - b1, b2=b2, one_minus_b2=1 - b2, eps=opt.eps,
            bias_correction=bool(opt.bias_correction), decoupled_decay=bool(opt._decay),
        )
        done.update((n, tuple(flat[3 * j:3 * j + 3])) for j, n in enumerate(part))
    return done


def _grouped_kernel_update(opt, leaves, adam) -> dict:
    """{leaf index: (parameter, m, v)} of the leaves a backend's grouped Adam
    kernels ``adam`` take (``Backend.adam_kernels``: CUDA's, up to sixteen
    per launch)."""
    grouped = [n for n, (g, p, s) in enumerate(leaves) if adam.eligible(g, p, s)]
    if not grouped:
        return {}
    opt._warn_float16(leaves[grouped[0]][1])
    b1, b2 = opt.betas
    new = adam.update([(leaves[n][0], leaves[n][1], leaves[n][2]["m"], leaves[n][2]["v"]) for n in grouped],
                      opt._step_scalars(), b1, b2, opt.eps, bool(opt.bias_correction), bool(opt._decay))
    return dict(zip(grouped, new))


def _gather(g, p, s, leaves: list, slots: list):
    """The gradient tree's structure (dicts and lists, walked as ``tree_map``
    walks it, with the parameters and the state beside it), each leaf left
    as a slot to fill: ``leaves`` gets (gradient, parameter, state) and
    ``slots`` (container, key), in the same order. One walk where
    ``tree_map`` makes two. None where the tree holds anything else (or is
    a single array)."""
    if isinstance(g, dict):
        out: dict = {}
        keys = g.items()
    elif type(g) is list:
        out = [None] * len(g)
        keys = enumerate(g)
    else:
        return None
    for k, v in keys:
        if isinstance(v, mx.array):
            leaves.append((v, p[k], s[k]))
            slots.append((out, k))
            out[k] = None  # the key's place, so the tree keeps tree_map's key order
        else:
            out[k] = _gather(v, p[k], s[k], leaves, slots)
            if out[k] is None:
                return None
    return out


def _masters(grads, params, masters, dtype, path: str, missing: list):
    """The master copy of every parameter the gradient tree names: the one
    kept from earlier steps, else the parameter cast to ``dtype`` (first
    step, a parameter that began training since, or one a restored state
    lacks), whose name then goes to ``missing``. Lists match by position,
    and a shorter one is not a mismatch: ``tree_flatten`` writes nothing for
    a parameter-free layer (a ReLU in a Sequential), so ``tree_unflatten``
    of a saved state drops the trailing ones."""
    if isinstance(grads, dict):
        masters = masters if isinstance(masters, dict) else {}
        return {k: _masters(g, params[k], masters.get(k), dtype, f"{path}{k}.", missing) for k, g in grads.items()}
    if isinstance(grads, (list, tuple)):
        if isinstance(masters, dict):  # a list written as a dict of indices
            masters = [masters.get(str(i)) for i in range(len(grads))]
        masters = masters if isinstance(masters, (list, tuple)) else ()
        return [
            _masters(g, params[i], masters[i] if i < len(masters) else None, dtype, f"{path}{i}.", missing)
            for i, g in enumerate(grads)
        ]
    if isinstance(masters, mx.array):
        if masters.shape != params.shape:
            raise ValueError(
                f"MixedPrecision: the master copy of {path[:-1]!r} has shape {tuple(masters.shape)}, the "
                f"parameter {tuple(params.shape)}; after changing the model, remake the master copy with "
                f"opt.init(model.trainable_parameters())"
            )
        return masters
    missing.append(path[:-1])
    return params.astype(dtype)


class MixedPrecision:
    """Train a half-precision model on float32 master weights.

    ``MixedPrecision(optimizer)`` wraps any
    ``mlx.optimizers`` optimizer (ours included) and has its interface:
    ``update(model, grads)``, ``apply_gradients(grads, params)``,
    ``init(params)``, ``state``, ``learning_rate``, ``step``. The model's
    parameters stay in their own dtype (float16 or bfloat16, for fast
    passes and small activations); the wrapper keeps a float32 copy of every
    trained parameter (``state["master"]``), and the wrapped optimizer's
    state is float32 too. Each update casts the gradients up,
    lets the optimizer update the master copy, and writes the master copy
    cast to each parameter's dtype back to the model. Small updates that
    round away in float16 accumulate in the master copy, and Adam's ``eps``
    and second moments never underflow.

        model.set_dtype(mx.float16)
        opt = MixedPrecision(Adam(learning_rate=1e-3))
        loss, grads = mlx.nn.value_and_grad(model, loss_fn)(model, x)
        opt.update(model, grads)

    The master copy is made from the model on the first update (or by
    ``init(model.trainable_parameters())``). It is the truth from then on:
    after loading other weights into the model (``load_weights``, a
    converter), call ``init`` again, or the next update overwrites them.
    ``state`` holds the master copy and the optimizer's state, so saving and
    loading it (``tree_flatten`` / ``tree_unflatten``, through
    ``mx.save_safetensors`` / ``mx.load`` or not) resumes training bitwise
    as the uninterrupted run; a parameter the restored state has no master
    copy of gets one from the model's half-precision values, with a warning
    naming it, and a master copy of the wrong shape raises. ``mx.compile``
    takes the state as captured state like any
    optimizer's (call ``init(model.trainable_parameters())`` first, then
    ``state = [model.state, opt.state]``). Gradients are those of
    the half-precision model: compute the loss in float32
    (``logits.astype(mx.float32)``). No loss scaling is applied.
    """

    master_dtype = mx.float32

    def __init__(self, optimizer):
        if not isinstance(optimizer, mopt.Optimizer):
            raise TypeError(
                f"optimizer must be an mlx.optimizers.Optimizer (e.g. mlx_lattice.optimizers.Adam(...)), "
                f"got {type(optimizer).__name__}"
            )
        self.optimizer = optimizer
        self._state = {"master": None, "optimizer": optimizer.state}

    # -------------------------------------------------------------- state
    @property
    def state(self) -> dict:
        """``{"master": master weights, "optimizer": the wrapped optimizer's state}``."""
        self._state["optimizer"] = self.optimizer.state
        return self._state

    @state.setter
    def state(self, state: dict):
        if not isinstance(state, dict) or set(state) != {"master", "optimizer"}:
            raise ValueError("state must be a dict with keys 'master' and 'optimizer' (a MixedPrecision state)")
        self._state["master"] = state["master"]
        self.optimizer.state = state["optimizer"]
        self._state["optimizer"] = self.optimizer.state

    @property
    def learning_rate(self):
        return self.optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        self.optimizer.learning_rate = value

    @property
    def step(self):
        return self.optimizer.step

    # -------------------------------------------------------------- updates
    def init(self, parameters) -> None:
        """(Re)make the master copy from ``parameters`` (e.g.
        ``model.trainable_parameters()``) and initialise the optimizer's
        state for it (moments already there are kept)."""
        master = tree_map(lambda p: p.astype(self.master_dtype), parameters)
        self._state["master"] = master
        self.optimizer.init(master)

    def apply_gradients(self, gradients, parameters):
        """Parameters after one step, each in its own dtype, shaped as
        ``gradients`` (``parameters`` may hold more, e.g. the model)."""
        dtype = self.master_dtype
        missing: list = []
        master = _masters(gradients, parameters, self._state["master"], dtype, "", missing)
        if missing and self._state["master"] is not None:
            # Never silent: made from the half-precision values, these
            # masters have lost what the float32 copy held, so a resumed run
            # would drift from the uninterrupted one.
            names = ", ".join(repr(n) for n in missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            warnings.warn(
                f"MixedPrecision: the state holds no master copy of {names}; made from the model's "
                f"{_dtype_names(parameters, missing)} values. Expected for a parameter that began training since "
                f"the state was made; after loading a saved state it means the state lacks it, and training "
                f"does not resume exactly",
                stacklevel=2,
            )
        grads = tree_map(lambda g: g.astype(dtype), gradients)
        master = self.optimizer.apply_gradients(grads, master)
        self._state["master"] = master
        return tree_map(lambda m, p: m.astype(p.dtype), master, parameters)

    def update(self, model, gradients) -> None:
        """Apply the gradients to the master copy and write it to the model."""
        model.update(self.apply_gradients(gradients, model))

    def __repr__(self) -> str:
        return f"MixedPrecision({type(self.optimizer).__name__})"


def _dtype_names(parameters, paths) -> str:
    from mlx.utils import tree_flatten

    flat = dict(tree_flatten(parameters))
    names = sorted({str(flat[p].dtype).removeprefix("mlx.core.") for p in paths if p in flat})
    return "/".join(names) or "own"


def compiled_update(model, optimizer):
    """``update(grads)``: ``optimizer.update(model, grads)`` under
    ``mx.compile``, with the model's and the optimizer's state captured (the
    form MLX's training loops use). On GPU streams MLX then fuses each
    parameter's update into one kernel, where the eager update dispatches
    about two dozen elementwise ops per parameter (3,600 primitives a
    MinkUNet step); on the CPU the fused float32 update above runs as it is,
    and so does the grouped update of ``Adam`` / ``AdamW`` on CUDA (the
    returned function is then the eager update). Under ``mx.compile`` the
    results are the eager update's to a few ulps (fused multiply-adds may
    contract).

        update = optim.compiled_update(model, opt)
        loss, grads = loss_and_grad(model, x)
        update(grads)
        mx.eval(loss, model.state, opt.state)
    """
    base = getattr(optimizer, "optimizer", optimizer)
    if isinstance(base, _FusedAdam) and backends.current().adam_kernels() is not None:
        # sixteen parameters a launch already (apply_gradients); under
        # mx.compile the call would only add its tracing and inputs
        def eager(grads):
            optimizer.update(model, grads)

        return eager
    if not getattr(base, "_initialized", True):
        # The state made now, not inside the first call: a state that changes
        # shape after the first call makes mx.compile trace (and, on GPUs,
        # build its kernels) a second time.
        optimizer.init(model.trainable_parameters())
    state = [model.state, optimizer.state]

    def update(grads):
        optimizer.update(model, grads)

    return mx.compile(update, inputs=state, outputs=state)


__all__ = ["Adam", "AdamW", "MixedPrecision", "compiled_update"]
