"""The fused Adam / AdamW update against MLX's optimizers and a NumPy oracle.

MLX's optimizers are the reference for bitwise equality (same float32
rounding of every step); the NumPy oracle below recomputes the update from
its definition in float64, independently of both.
"""

import numpy as np
import pytest
import mlx.core as mx
import mlx.nn as mnn
import mlx.optimizers as mopt
from mlx.utils import tree_flatten

import mlx_lattice as ml
import mlx_lattice.optimizers as optim
from mlx_lattice import _ext

from conftest import assert_same_across_threads



def oracle(grads, p, lr, b1, b2, eps, bias_correction=False, wd=0.0):
    """Parameters and moments after len(grads) Adam(W) steps, float64."""
    p = np.asarray(p, np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        g = np.asarray(g, np.float64)
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        if bias_correction:
            p = p - lr / (1 - b1**t) * m / (np.sqrt(v) / np.sqrt(1 - b2**t) + eps)
        else:
            p = p - lr * m / (np.sqrt(v) + eps)
    return p, m, v


def params(rng, shapes):
    return {f"p{i}": mx.array(rng.standard_normal(s).astype(np.float32)) for i, s in enumerate(shapes)}


# Sizes around the vector widths (4, 8, 16) and the task grain (32768).
SHAPES = [(1,), (3,), (17,), (16, 33), (5, 3, 7), (32768 + 5,), (0,)]

CONFIGS = [
    ("adam", dict(learning_rate=1e-2)),
    ("adam", dict(learning_rate=3e-3, betas=[0.8, 0.99], eps=1e-6, bias_correction=True)),
    ("adamw", dict(learning_rate=1e-2, weight_decay=0.1)),
    ("adamw", dict(learning_rate=2e-3, weight_decay=0.0, bias_correction=True)),
]


def make(kind, fused, kw):
    if kind == "adam":
        return (optim.Adam if fused else mopt.Adam)(**kw)
    return (optim.AdamW if fused else mopt.AdamW)(**kw)


@pytest.mark.usefixtures("on_cpu")  # the CPU primitive, per instruction-set path
@pytest.mark.parametrize("kind,kw", CONFIGS)
def test_bitwise_equal_to_mlx_and_close_to_oracle(rng, isa, kind, kw, monkeypatch):
    calls = []
    fused_update = _ext.adam_update_group
    monkeypatch.setattr(_ext, "adam_update_group", lambda *a, **k: calls.append(len(a[0])) or fused_update(*a, **k))
    ps = params(rng, SHAPES)
    grads = [
        {k: mx.array(rng.standard_normal(v.shape).astype(np.float32)) for k, v in ps.items()}
        for _ in range(3)
    ]
    fused, ref = make(kind, True, kw), make(kind, False, kw)
    a, b = dict(ps), dict(ps)
    for g in grads:
        a = fused.apply_gradients(g, a)
        b = ref.apply_gradients(g, b)
        mx.eval(a, b, fused.state, ref.state)
    for k in ps:
        np.testing.assert_array_equal(np.array(a[k]), np.array(b[k]))
        np.testing.assert_array_equal(np.array(fused.state[k]["m"]), np.array(ref.state[k]["m"]))
        np.testing.assert_array_equal(np.array(fused.state[k]["v"]), np.array(ref.state[k]["v"]))
        b1, b2 = kw.get("betas", [0.9, 0.999])
        want_p, want_m, want_v = oracle(
            [np.array(g[k]) for g in grads], np.array(ps[k]), kw["learning_rate"], b1, b2,
            kw.get("eps", 1e-8), kw.get("bias_correction", False), kw.get("weight_decay", 0.0),
        )
        np.testing.assert_allclose(np.array(fused.state[k]["m"]), want_m, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.array(fused.state[k]["v"]), want_v, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(np.array(a[k]), want_p, rtol=1e-5, atol=1e-5)
    assert int(fused.step) == int(ref.step) == 3
    # every float32 parameter took the fused update, all of a step's in one primitive
    assert calls == [len(SHAPES)] * 3


def test_model_update_with_schedule_and_state_layout(rng):
    model = mnn.Sequential(mnn.Linear(5, 7), mnn.ReLU(), mnn.Linear(7, 2))
    ref_model = mnn.Sequential(mnn.Linear(5, 7), mnn.ReLU(), mnn.Linear(7, 2))
    ref_model.update(model.parameters())
    schedule = mopt.cosine_decay(1e-2, 10)
    fused, ref = optim.Adam(learning_rate=schedule), mopt.Adam(learning_rate=schedule)
    x = mx.array(rng.standard_normal((9, 5)).astype(np.float32))

    def loss(m):
        return (m(x) ** 2).mean()

    for _ in range(4):
        for m, opt in ((model, fused), (ref_model, ref)):
            _, g = mnn.value_and_grad(m, loss)(m)
            opt.update(m, g)
            mx.eval(m.parameters(), opt.state)
    for (ka, va), (kb, vb) in zip(tree_flatten(model.parameters()), tree_flatten(ref_model.parameters())):
        assert ka == kb
        np.testing.assert_array_equal(np.array(va), np.array(vb))
    assert sorted(k for k, _ in tree_flatten(fused.state)) == sorted(k for k, _ in tree_flatten(ref.state))
    np.testing.assert_array_equal(np.array(fused.learning_rate), np.array(ref.learning_rate))


def test_other_dtypes_take_mlx_update(rng):
    p = {"w": mx.array(rng.standard_normal((6, 4)).astype(np.float32)).astype(mx.bfloat16)}
    g = {"w": mx.array(rng.standard_normal((6, 4)).astype(np.float32)).astype(mx.bfloat16)}
    a = optim.Adam(learning_rate=1e-2).apply_gradients(g, p)
    b = mopt.Adam(learning_rate=1e-2).apply_gradients(g, p)
    assert a["w"].dtype == mx.bfloat16
    np.testing.assert_array_equal(np.array(a["w"].astype(mx.float32)), np.array(b["w"].astype(mx.float32)))


def test_bitwise_across_threads(rng):
    ps = params(rng, [(70001,), (33, 65)])
    g = {k: mx.array(rng.standard_normal(v.shape).astype(np.float32)) for k, v in ps.items()}

    def run():
        opt = optim.AdamW(learning_rate=1e-2, weight_decay=0.05, bias_correction=True)
        out = opt.apply_gradients(g, dict(ps))
        out = opt.apply_gradients(g, out)
        mx.eval(out, opt.state)
        return [out[k] for k in ps] + [opt.state[k][s] for k in ps for s in ("m", "v")]

    assert_same_across_threads(run)


def test_inputs_stay_intact_when_still_held(rng):
    # The update never writes into its inputs.
    p = {"w": mx.array(rng.standard_normal((300,)).astype(np.float32))}
    g = {"w": mx.array(rng.standard_normal((300,)).astype(np.float32))}
    before = np.array(p["w"])
    opt = optim.Adam(learning_rate=1e-1)
    out = opt.apply_gradients(g, p)
    mx.eval(out)
    np.testing.assert_array_equal(np.array(p["w"]), before)
    assert not np.array_equal(np.array(out["w"]), before)


def test_bad_arguments():
    p = mx.zeros((4,))
    s = mx.array([1e-3, 1.0, 1.0])
    kw = dict(b1=0.9, one_minus_b1=0.1, b2=0.999, one_minus_b2=0.001, eps=1e-8,
              bias_correction=False, decoupled_decay=False)
    with pytest.raises(ValueError, match="gradient must have the parameter's shape"):
        _ext.adam_update(mx.zeros((5,)), p, p, p, s, **kw)
    with pytest.raises(ValueError, match="m must be float32"):
        _ext.adam_update(p, p, p.astype(mx.float16), p, s, **kw)
    with pytest.raises(ValueError, match=r"scalars must be float32 of shape \(3,\)"):
        _ext.adam_update(p, p, p, p, s[:2], **kw)
    with pytest.raises(ValueError, match="v must have the parameter's shape"):
        _ext.adam_update_group([p, p], [p, p], [p, p], [p, mx.zeros((3,))], s, **kw)
    with pytest.raises(ValueError, match="one entry per parameter"):
        _ext.adam_update_group([p], [p, p], [p, p], [p, p], s, **kw)
    assert _ext.adam_update_group([], [], [], [], s, **kw) == []


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("group", [16, 2])
def test_one_primitive_updates_every_parameter(rng, group, monkeypatch):
    """A step's float32 parameters (any shapes, strided gradients among
    them) go through one AdamUpdate primitive per ``CPU_GROUP`` of them,
    with the bits of one primitive per parameter and of MLX's Adam; a
    float16 parameter keeps MLX's update beside it."""
    monkeypatch.setattr(optim, "CPU_GROUP", group)
    ps = {"a": mx.array(rng.standard_normal((7, 5)).astype(np.float32)),
          "b": [mx.array(rng.standard_normal((40000,)).astype(np.float32)),
                mx.array(rng.standard_normal((3,)).astype(np.float32))],
          "h": mx.array(rng.standard_normal((4,)).astype(np.float16))}
    gs = {"a": mx.array(rng.standard_normal((5, 7)).astype(np.float32)).T,
          "b": [mx.array(rng.standard_normal((40000,)).astype(np.float32)),
                mx.broadcast_to(mx.array(0.3, mx.float32), (3,))],
          "h": mx.array(rng.standard_normal((4,)).astype(np.float16))}
    fused, ref = optim.AdamW(learning_rate=1e-2), mopt.AdamW(learning_rate=1e-2)
    a, b = dict(ps), dict(ps)
    for _ in range(2):
        a = fused.apply_gradients(gs, a)
        b = ref.apply_gradients(gs, b)
        buf = __import__("io").StringIO()
        mx.export_to_dot(buf, a["a"], a["b"], fused.state)
        assert buf.getvalue().count('label ="AdamUpdate"') == (1 if group == 16 else 2)  # 3 parameters
        mx.eval(a, b, fused.state, ref.state)
    assert [k for k, _ in tree_flatten(a)] == [k for k, _ in tree_flatten(b)]  # tree_map's order
    for (k, x), (_, y) in zip(tree_flatten(a), tree_flatten(b)):
        np.testing.assert_array_equal(np.array(x), np.array(y), err_msg=k)
    singles = [_ext.adam_update(gs["b"][i], ps["b"][i], mx.zeros((n,)), mx.zeros((n,)), fused._step_scalars(),
                                b1=0.9, one_minus_b1=0.1, b2=0.999, one_minus_b2=0.001, eps=1e-8,
                                bias_correction=True, decoupled_decay=True)
               for i, n in enumerate((40000, 3))]
    group = _ext.adam_update_group(gs["b"], ps["b"], [mx.zeros((40000,)), mx.zeros((3,))],
                                   [mx.zeros((40000,)), mx.zeros((3,))], fused._step_scalars(),
                                   b1=0.9, one_minus_b1=0.1, b2=0.999, one_minus_b2=0.001, eps=1e-8,
                                   bias_correction=True, decoupled_decay=True)
    for x, y in zip([o for single in singles for o in single], group):
        np.testing.assert_array_equal(np.array(x), np.array(y))


def test_minkunet_step_matches_mlx_adam(rng):
    from mlx_lattice.models import MinkUNet
    from mlx_lattice.tensor import SparseTensor

    coords = np.unique(rng.integers(0, 12, (400, 3)), axis=0)
    coords = np.concatenate([np.zeros((len(coords), 1), np.int64), coords], 1).astype(np.int32)
    feats = mx.array(rng.standard_normal((len(coords), 3)).astype(np.float32))
    mx.random.seed(3)
    a = MinkUNet(3, 2, width=0.25)
    b = MinkUNet(3, 2, width=0.25)
    b.update(a.parameters())
    mx.eval(a.parameters(), b.parameters())

    def loss(m, x):
        return (m(x).feats ** 2).mean()

    for model, opt in ((a, optim.Adam(learning_rate=1e-3)), (b, mopt.Adam(learning_rate=1e-3))):
        for _ in range(2):
            _, g = mnn.value_and_grad(model, loss)(model, SparseTensor(coords, feats))
            opt.update(model, g)
            mx.eval(model.parameters(), opt.state)
    for (_, va), (_, vb) in zip(tree_flatten(a.parameters()), tree_flatten(b.parameters())):
        np.testing.assert_array_equal(np.array(va), np.array(vb))


def test_strided_and_broadcast_inputs(rng):
    # Gradients need not be dense: a transposed view and a broadcast scalar.
    p = {
        "a": mx.array(rng.standard_normal((7, 5)).astype(np.float32)),
        "b": mx.array(rng.standard_normal((3, 4)).astype(np.float32)),
        "c": mx.array(rng.standard_normal((6, 3, 3, 3, 4)).astype(np.float32)),
        "d": mx.array(rng.standard_normal((2, 5, 7)).astype(np.float32)),
    }
    g = {
        "a": mx.array(rng.standard_normal((5, 7)).astype(np.float32)).T,
        "b": mx.broadcast_to(mx.array(0.7, mx.float32), (3, 4)),
        # a convolution weight's gradient: kernel-major, viewed channel-first
        "c": mx.transpose(mx.array(rng.standard_normal((3, 3, 3, 4, 6)).astype(np.float32)), (4, 0, 1, 2, 3)),
        "d": mx.array(rng.standard_normal((2, 9, 7)).astype(np.float32))[:, 2:7],
    }
    fused, ref = optim.Adam(learning_rate=1e-2), mopt.Adam(learning_rate=1e-2)
    a = fused.apply_gradients(g, dict(p))
    b = ref.apply_gradients(g, dict(p))
    mx.eval(a, b)
    for k in p:
        np.testing.assert_array_equal(np.array(a[k]), np.array(b[k]))


def test_compiled_update_matches_eager(rng):
    # The fused update inside mx.compile, with the optimizer state as the
    # compiled function's inputs and outputs (as for mlx.optimizers).
    from functools import partial

    def build():
        m = mnn.Sequential(mnn.Linear(6, 9), mnn.ReLU(), mnn.Linear(9, 3))
        return m, optim.AdamW(learning_rate=1e-2, weight_decay=0.01, bias_correction=True)

    mx.random.seed(5)
    a, opt_a = build()
    b, opt_b = build()
    b.update(a.parameters())
    x = mx.array(rng.standard_normal((11, 6)).astype(np.float32))

    def loss(m):
        return (m(x) ** 2).mean()

    state = [b.state, opt_b.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step():
        _, g = mnn.value_and_grad(b, loss)(b)
        opt_b.update(b, g)

    for _ in range(3):
        _, g = mnn.value_and_grad(a, loss)(a)
        opt_a.update(a, g)
        mx.eval(a.parameters(), opt_a.state)
        step()
        mx.eval(state)
    on_gpu = mx.default_device() == mx.gpu
    for (_, va), (_, vb) in zip(tree_flatten(a.parameters()), tree_flatten(b.parameters())):
        if on_gpu:
            # MLX fuses the compiled update into one GPU kernel whose multiply-adds
            # may contract: equal to a few ulps, not bitwise.
            np.testing.assert_allclose(np.array(va), np.array(vb), rtol=1e-6, atol=1e-8)
        else:
            np.testing.assert_array_equal(np.array(va), np.array(vb))


@pytest.mark.parametrize("mixed", [False, True])
def test_compiled_update_helper_matches_eager(rng, mixed):
    # optim.compiled_update: the same steps as opt.update, state captured
    # (MixedPrecision's master copy and schedule included).
    def build():
        mx.random.seed(7)
        m = mnn.Sequential(mnn.Linear(5, 8), mnn.ReLU(), mnn.Linear(8, 2))
        opt = optim.Adam(learning_rate=mopt.cosine_decay(1e-2, 10))
        if mixed:
            m.set_dtype(mx.bfloat16)
            opt = optim.MixedPrecision(opt)
        return m, opt

    (a, opt_a), (b, opt_b) = build(), build()
    x = mx.array(rng.standard_normal((13, 5)).astype(np.float32)).astype(a.layers[0].weight.dtype)
    update = optim.compiled_update(b, opt_b)

    def loss(m):
        return mx.square(m(x).astype(mx.float32)).mean()

    for _ in range(4):
        _, g = mnn.value_and_grad(a, loss)(a)
        opt_a.update(a, g)
        mx.eval(a.state, opt_a.state)
        _, g = mnn.value_and_grad(b, loss)(b)
        update(g)
        mx.eval(b.state, opt_b.state)
    assert int(opt_b.step) == 4
    for (_, va), (_, vb) in zip(tree_flatten(a.parameters()), tree_flatten(b.parameters())):
        va, vb = np.array(va.astype(mx.float32)), np.array(vb.astype(mx.float32))
        if mx.default_device() == mx.gpu:
            np.testing.assert_allclose(va, vb, rtol=1e-5, atol=1e-7)
        else:
            np.testing.assert_array_equal(va, vb)


def test_learning_rate_set_between_steps(rng):
    p = {"w": mx.array(rng.standard_normal((40,)).astype(np.float32))}
    g = {"w": mx.array(rng.standard_normal((40,)).astype(np.float32))}
    fused, ref = optim.Adam(learning_rate=1e-2), mopt.Adam(learning_rate=1e-2)
    a, b = dict(p), dict(p)
    for lr in (1e-2, 3e-1, 2e-3):
        fused.learning_rate = lr
        ref.learning_rate = lr
        a = fused.apply_gradients(g, a)
        b = ref.apply_gradients(g, b)
        mx.eval(a, b)
        np.testing.assert_array_equal(np.array(a["w"]), np.array(b["w"]))


# ------------------------------------------------ saving and resuming MixedPrecision
def _resume_net():
    from mlx_lattice import nn

    mx.random.seed(11)
    # The inner Sequential ends in a ReLU: tree_flatten writes nothing for
    # it, so tree_unflatten of a saved state gives that list one entry less.
    return nn.Sequential(nn.Sequential(nn.SubmConv3d(4, 16, 3, bias=False), nn.BatchNorm(16), nn.ReLU()),
                         nn.SubmConv3d(16, 16, 3), nn.ReLU(), nn.Linear(16, 3))


def _resume_case(dtype):
    import oracle

    rng = np.random.default_rng(8)
    coords = oracle.random_coords(rng, 300, extent=10, low=0)
    x = ml.SparseTensor(coords, rng.standard_normal((len(coords), 4)).astype(np.float32)).astype(dtype)
    labels = mx.array(rng.integers(0, 3, len(coords)))

    def build():
        model = _resume_net()
        model.set_dtype(dtype)
        opt = optim.Adam(learning_rate=mopt.cosine_decay(1e-2, 20), bias_correction=True)
        return model, (opt if dtype == mx.float32 else optim.MixedPrecision(opt))

    def train(model, opt, steps):
        step = mnn.value_and_grad(model, lambda m: mnn.losses.cross_entropy(
            m(x).feats.astype(mx.float32), labels, reduction="mean"))
        for _ in range(steps):
            _, grads = step(model)
            opt.update(model, grads)
            mx.eval(model.state, opt.state)

    return build, train


def _bits(tree):
    return {k: (str(v.dtype), np.array(v.astype(mx.float32) if v.dtype == mx.bfloat16 else v))
            for k, v in tree_flatten(tree) if isinstance(v, mx.array)}


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
@pytest.mark.parametrize("via", ["tree", "safetensors"])
def test_resume_is_bitwise_the_uninterrupted_run(tmp_path, dtype, via):
    """Train 3 steps, save the model and the optimizer state, restore both
    into new objects, train 3 more: bitwise the 6-step run (float32 master
    weights, moments, step and schedule included). MixedPrecision wraps the
    half-precision cases; float32 is plain Adam."""
    import warnings

    from mlx.utils import tree_unflatten

    build, train = _resume_case(dtype)
    ref_model, ref_opt = build()
    train(ref_model, ref_opt, 6)

    model, opt = build()
    train(model, opt, 3)
    flat = dict(tree_flatten(opt.state))
    weights = str(tmp_path / "model.safetensors")
    model.save_weights(weights)
    if via == "safetensors":  # what a checkpoint on disk holds
        mx.save_safetensors(str(tmp_path / "opt.safetensors"), flat)
        flat = mx.load(str(tmp_path / "opt.safetensors"))
    del model, opt
    model, opt = build()
    model.load_weights(weights)
    opt.state = tree_unflatten(list(flat.items()))
    if dtype != mx.float32:
        assert len(opt.state["master"]["layers"][0]["layers"]) == 2  # the trailing ReLU's entry is gone
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no master copy is remade
        train(model, opt, 3)
    want, got = _bits(ref_model.parameters()), _bits(model.parameters())  # running statistics included
    assert want.keys() == got.keys()
    for k in want:
        assert want[k][0] == got[k][0] and np.array_equal(want[k][1], got[k][1]), k
    want, got = _bits(ref_opt.state), _bits(opt.state)
    assert want.keys() == got.keys() and len(want) > 10
    for k in want:
        assert want[k][0] == got[k][0] and np.array_equal(want[k][1], got[k][1]), k


def test_resume_never_remakes_master_weights_silently():
    from mlx.utils import tree_unflatten

    build, train = _resume_case(mx.float16)
    model, opt = build()
    train(model, opt, 2)
    flat = dict(tree_flatten(opt.state))
    # a state that lacks a master copy: the update says which, and from what
    lacking = {k: v for k, v in flat.items() if k != "master.layers.1.weight"}
    other, opt2 = build()
    other.update(model.parameters())
    opt2.state = tree_unflatten(list(lacking.items()))
    with pytest.warns(UserWarning, match=r"no master copy of 'layers.1.weight'; made from the model's float16"):
        train(other, opt2, 1)
    # a master copy of another shape is another model's: an error naming it
    wrong = dict(flat, **{"master.layers.3.weight": mx.zeros((2, 16))})
    other, opt3 = build()
    opt3.state = tree_unflatten(list(wrong.items()))
    with pytest.raises(ValueError, match=r"master copy of 'layers.3.weight' has shape \(2, 16\), the parameter \(3, 16\)"):
        train(other, opt3, 1)
