"""Adam / AdamW on CUDA, sixteen parameters a launch (mlx_lattice/backends/cuda/adam.py),
against MLX's own optimizers (``mlx.optimizers``) run as MLX ops.

The kernel runs only where MLX's CUDA backend sees a GPU; the tree handling
around it (``_FusedAdam.apply_gradients`` on CUDA) also runs on every
machine with the kernel replaced by MLX's per-parameter update.
"""


import numpy as np
import pytest
import mlx.core as mx
import mlx.optimizers as mopt
from mlx.utils import tree_flatten

from mlx_lattice import backends
from mlx_lattice import optimizers as optim
from mlx_lattice.backends.cuda import adam

from conftest import needs_cuda, to_np


def tree(rng, dtype, n_convs=20):
    """A parameter tree of a network's shapes: 5D weights and 1D vectors in
    nested dicts and lists (more than one launch's worth of each rank)."""
    def arr(*shape):
        return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)
    layers = [{"conv": {"weight": arr(8, 3, 3, 3, 4 + i % 3)}, "norm": {"weight": arr(8), "bias": arr(8)}}
              for i in range(n_convs)]
    return {"layers": layers, "head": {"weight": arr(5, 8), "bias": arr(5)}, "scale": arr(3)}


def grads_like(rng, params):
    return {k: grads_like(rng, v) for k, v in params.items()} if isinstance(params, dict) else (
        [grads_like(rng, v) for v in params] if isinstance(params, list)
        else mx.array(rng.standard_normal(params.shape).astype(np.float32)).astype(params.dtype))


def run(opt, params, grads_seq):
    for g in grads_seq:
        params = opt.apply_gradients(g, params)
        mx.eval(params, opt.state)
    return params


OPTS = {
    "adam": (lambda: optim.Adam(learning_rate=1e-2), lambda: mopt.Adam(learning_rate=1e-2)),
    "adam-bias": (lambda: optim.Adam(learning_rate=1e-2, bias_correction=True),
                  lambda: mopt.Adam(learning_rate=1e-2, bias_correction=True)),
    "adamw": (lambda: optim.AdamW(learning_rate=1e-2, weight_decay=0.05),
              lambda: mopt.AdamW(learning_rate=1e-2, weight_decay=0.05)),
}


def _mlx_update(items, scalars, b1, b2, eps, bias_correction, decay, opt):
    """The grouped update's contract from MLX's per-parameter update."""
    out = []
    for g, p, m, v in items:
        state = {"m": m, "v": v}
        new = mopt.Adam.apply_single(opt, g, p * (1 - opt.learning_rate.astype(g.dtype) * opt.weight_decay)
                                     if decay else p, state)
        out.append((new, state["m"], state["v"]))
    return out


@pytest.mark.parametrize("kind", sorted(OPTS))
def test_tree_handling_matches_mlx(rng, kind, monkeypatch):
    # The CUDA path's walk of the trees, with MLX's update standing in for
    # the kernel: the same parameters, state and step as MLX's optimizer.
    ours, theirs = OPTS[kind][0](), OPTS[kind][1]()
    monkeypatch.setattr(backends, "current", lambda stream=None: backends.get("cuda"))
    monkeypatch.setattr(adam, "update", lambda items, *a: _mlx_update(items, *a, opt=ours))
    params = tree(rng, mx.float32)
    grads = [grads_like(rng, params) for _ in range(3)]
    a, b = run(ours, params, grads), run(theirs, params, grads)
    fa, fb = tree_flatten(a), tree_flatten(b)
    assert [k for k, _ in fa] == [k for k, _ in fb]
    for (k, x), (_, y) in zip(fa, fb):
        assert to_np(x).tobytes() == to_np(y).tobytes(), k
    assert int(ours.step) == int(theirs.step) == 3
    for (k, x), (_, y) in zip(tree_flatten(ours.state), tree_flatten(theirs.state)):
        assert to_np(x).tobytes() == to_np(y).tobytes(), k


def test_eligible():
    f, h = mx.zeros((4, 3)), mx.zeros((4, 3), mx.float16)
    assert adam.eligible(f, f, {"m": f, "v": f})
    assert not adam.eligible(h, f, {"m": f, "v": f})  # gradient dtype differs
    assert not adam.eligible(f, f, {"m": f[:2], "v": f})  # moment shape differs
    assert not adam.eligible(f, f, {})  # no state yet


@pytest.mark.cuda
@needs_cuda
@pytest.mark.usefixtures("on_gpu")
@pytest.mark.parametrize("kind", sorted(OPTS))
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_grouped_kernel_against_mlx(rng, kind, dtype):
    """Five steps over 63 parameters (launches: two of 5D weights, three of
    vectors, one of 2D): float32 gives MLX's bits; half precision is within
    an ulp or two of MLX's update (float computations rounded to the dtype
    against MLX's half arithmetic), and repeats bit for bit."""
    params = tree(rng, dtype)
    grads = [grads_like(rng, params) for _ in range(5)]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = run(OPTS[kind][0](), params, grads)
        again = run(OPTS[kind][0](), params, grads)
        b = run(OPTS[kind][1](), params, grads)
    for (k, x), (_, y), (_, z) in zip(tree_flatten(a), tree_flatten(b), tree_flatten(again)):
        assert x.dtype == dtype and x.shape == y.shape, k
        assert to_np(x).tobytes() == to_np(z).tobytes(), k
        if dtype == mx.float32:
            assert to_np(x).tobytes() == to_np(y).tobytes(), k
        else:
            ulp = 2.0 ** (-10 if dtype == mx.float16 else -7)
            np.testing.assert_allclose(to_np(x), to_np(y), rtol=3 * ulp, atol=1e-3, err_msg=k)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.usefixtures("on_gpu")
def test_a_step_launches_few_kernels(rng):
    """The update of 63 parameters is six kernels, not one or more each."""
    from mlx_lattice.bench.cuda_profile import graph_nodes

    params = tree(rng, mx.float32)
    opt = optim.Adam(learning_rate=1e-2)
    opt.init(params)
    new = opt.apply_gradients(grads_like(rng, params), params)
    nodes = graph_nodes(*[v for _, v in tree_flatten(new)], *[v for _, v in tree_flatten(opt.state)])
    assert sum(v for k, v in nodes.items() if "Custom" in k) == 6, nodes
