"""Fused normalisation + activation (+ residual) against a NumPy oracle.

The oracle below computes batch / instance norm, the activation and the
residual add in float64 from first principles; gradients are checked against
central differences of that oracle (small sizes) and against the MLX-op path
of the same layers (larger sizes, all dtypes).
"""

import numpy as np
import pytest
import mlx.core as mx
import mlx.nn as mnn
from mlx.utils import tree_flatten

import mlx_lattice
from mlx_lattice import SparseTensor, nn
from mlx_lattice.models import MinkUNet
from mlx_lattice.nn.normalization import fused_norms

from conftest import TOLERANCES, check_statistics_gradients, to_np
from oracle import numeric_grad

ACTS = {"none": None, "relu": nn.ReLU(), "leaky": nn.LeakyReLU(0.2)}


def oracle(x, w, b, groups, act, residual=None, eps=1e-5, stats=None):
    """act(weight * (x - mean_g) / sqrt(var_g + eps) + bias + residual), float64;
    ``groups`` gives each row's statistics group; ``stats`` (mean, var) fixed."""
    x = np.asarray(x, np.float64)
    z = np.empty_like(x)
    for g in np.unique(groups):
        sel = groups == g
        if stats is None:
            mean, var = x[sel].mean(0), x[sel].var(0)
        else:
            mean, var = stats
        z[sel] = (x[sel] - mean) / np.sqrt(var + eps) * w + b
    if residual is not None:
        z = z + residual
    if act == "relu":
        return np.maximum(z, 0)
    if act == "leaky":
        return np.where(z > 0, z, 0.2 * z)
    return z


def tensor(rng, n, c, batch=1, dtype=mx.float32, scale=3.0):
    coords = np.zeros((n, 4), np.int32)
    coords[:, 0] = np.sort(rng.integers(0, batch, n)) if batch > 1 else 0
    coords[:, 1:] = rng.permutation(40**3)[:n, None] // np.array([1600, 40, 1]) % 40
    feats = (rng.standard_normal((n, c)) * scale + rng.standard_normal(c)).astype(np.float32)
    return SparseTensor(coords, mx.array(feats).astype(dtype))


def affine(rng, norm):
    c = norm.num_features
    norm.weight = mx.array(rng.uniform(0.5, 1.5, c).astype(np.float32))
    norm.bias = mx.array(rng.standard_normal(c).astype(np.float32))
    return to_np(norm.weight), to_np(norm.bias)


@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("n,c", [(1, 3), (7, 1), (600, 5), (1000, 67)])
def test_batch_norm_act_values(rng, act, residual, n, c):
    x = tensor(rng, n, c)
    bn = nn.BatchNorm(c, momentum=0.3)
    w, b = affine(rng, bn)
    r = rng.standard_normal((n, c)).astype(np.float32) if residual else None
    y = nn.norm_act(bn, x, ACTS[act], None if r is None else mx.array(r))
    xf = to_np(x.feats)
    np.testing.assert_allclose(to_np(y.feats), oracle(xf, w, b, np.zeros(n), act, r), rtol=1e-4, atol=1e-4)
    # running statistics: momentum update with the unbiased variance
    if n > 1:
        np.testing.assert_allclose(to_np(bn.running_mean), 0.3 * xf.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(to_np(bn.running_var), 0.7 + 0.3 * xf.var(0, ddof=1), rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(to_np(bn.running_mean), 0.0)
    # eval mode: the running statistics
    bn.eval()
    y = nn.norm_act(bn, x, ACTS[act], None if r is None else mx.array(r))
    stats = (to_np(bn.running_mean), to_np(bn.running_var))
    np.testing.assert_allclose(
        to_np(y.feats), oracle(xf, w, b, np.zeros(n), act, r, stats=stats), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("residual", [False, True])
def test_instance_norm_act_values(rng, act, residual):
    x = tensor(rng, 900, 6, batch=3)
    # rows of a batch item need not be contiguous
    perm = rng.permutation(len(x))
    x = SparseTensor(np.array(x.coords)[perm], x.feats[mx.array(perm)])
    inorm = nn.InstanceNorm(6)
    w, b = affine(rng, inorm)
    r = rng.standard_normal((900, 6)).astype(np.float32) if residual else None
    y = nn.norm_act(inorm, x, ACTS[act], None if r is None else mx.array(r))
    groups = np.array(x.coords)[:, 0]
    np.testing.assert_allclose(
        to_np(y.feats), oracle(to_np(x.feats), w, b, groups, act, r), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("kind", ["batch", "batch-eval", "instance"])
@pytest.mark.parametrize("act", ["relu", "leaky", "none"])
def test_gradients_against_finite_differences(rng, kind, act):
    n, c = 9, 3
    x = tensor(rng, n, c, batch=2 if kind == "instance" else 1)
    norm = nn.InstanceNorm(c) if kind == "instance" else nn.BatchNorm(c)
    affine(rng, norm)
    groups = np.array(x.coords)[:, 0] if kind == "instance" else np.zeros(n)
    stats = None
    if kind == "batch-eval":
        norm.running_mean = mx.array(rng.standard_normal(c).astype(np.float32))
        norm.running_var = mx.array(rng.uniform(0.5, 2, c).astype(np.float32))
        stats = (to_np(norm.running_mean), to_np(norm.running_var))
        norm.eval()
    ct = rng.standard_normal((n, c))
    xf = to_np(x.feats)
    r = rng.standard_normal((n, c)).astype(np.float32)

    def f_np(xv, wv, bv, rv):
        return (oracle(xv, wv, bv, groups, act, rv, stats=stats) * ct).sum()

    def f_mx(xv, wv, bv, rv):
        norm.weight, norm.bias = wv, bv
        return (nn.norm_act(norm, x.replace(xv), ACTS[act], rv).feats * mx.array(ct.astype(np.float32))).sum()

    args = [xf, to_np(norm.weight), to_np(norm.bias), r.astype(np.float64)]
    grads = mx.grad(f_mx, argnums=[0, 1, 2, 3])(*[mx.array(a.astype(np.float32)) for a in args])
    for i, g in enumerate(grads):
        np.testing.assert_allclose(to_np(g), numeric_grad(f_np, args, i), rtol=2e-3, atol=2e-3)


@pytest.mark.usefixtures("on_cpu")  # calls the CPU primitive directly
def test_gradients_through_statistics_outputs(rng):
    """The batch mean / variance outputs carry gradients too (the raw op)."""
    check_statistics_gradients(mlx_lattice._ext.norm_act, rng)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("kind", ["batch", "instance"])
def test_fused_matches_op_path_with_gradients(rng, dtype, kind):
    """Values and all gradients (x, weight, bias, residual) of the fused
    primitive against the MLX-op path, across dtypes (float32 accumulation)."""
    n, c = 3000, 19
    x = tensor(rng, n, c, batch=3 if kind == "instance" else 1, dtype=dtype)
    norm = nn.InstanceNorm(c) if kind == "instance" else nn.BatchNorm(c)
    affine(rng, norm)
    if dtype != mx.float32:
        norm.set_dtype(dtype)
    r = mx.array(rng.standard_normal((n, c)).astype(np.float32)).astype(dtype)
    ct = mx.array(rng.standard_normal((n, c)).astype(np.float32)).astype(dtype)

    def loss(f, w, b, res):
        norm.weight, norm.bias = w, b
        y = nn.norm_act(norm, x.replace(f), nn.ReLU(), res).feats
        return (y.astype(mx.float32) * ct.astype(mx.float32)).sum()

    args = [x.feats, norm.weight, norm.bias, r]
    vg = mx.value_and_grad(loss, argnums=[0, 1, 2, 3])
    v1, g1 = vg(*args)
    # reference: the op path in float32 on the same (rounded) inputs
    ct = ct.astype(mx.float32)
    with fused_norms(False):
        v2, g2 = vg(*[a.astype(mx.float32) for a in args])
    tol = TOLERANCES[dtype]
    np.testing.assert_allclose(to_np(v1), to_np(v2), rtol=tol["rtol"], atol=tol["atol"] * n)
    for i, (a, b) in enumerate(zip(g1, g2)):
        assert a.dtype == dtype
        scale = max(1.0, np.abs(to_np(b)).max())
        a, b = to_np(a) / scale, to_np(b) / scale
        if dtype == mx.float32 or i in (1, 2):
            np.testing.assert_allclose(a, b, **tol)
        else:
            # Half-precision outputs round the pre-activation: a few values
            # next to 0 land on the other side of the ReLU.
            assert np.isclose(a, b, **tol).mean() > 0.999


@pytest.mark.usefixtures("on_cpu")  # the CPU primitive reads its cotangent's layout
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("layout", ["column slice", "transposed", "broadcast rows"])
def test_cotangent_layouts(rng, dtype, layout):
    """The backward pass reads a column slice of a wider cotangent (what a
    concatenation's gradient hands back) in place, and copies other layouts
    first: gradients bitwise equal to those from the same cotangent made
    contiguous, and close to the MLX-op path's."""
    n, c, extra = 700, 21, 13
    x = tensor(rng, n, c, dtype=dtype)
    norm = nn.BatchNorm(c)
    affine(rng, norm)
    r = mx.array(rng.standard_normal((n, c)).astype(np.float32)).astype(dtype)
    other = mx.array(rng.standard_normal((n, extra)).astype(np.float32)).astype(dtype)
    weights = mx.array(rng.standard_normal((n, c + extra)).astype(np.float32))
    row = mx.array(rng.standard_normal((c,)).astype(np.float32))
    square = mx.array(rng.standard_normal((c, c)).astype(np.float32))

    def head(y):
        # a loss whose cotangent for y arrives in the layout under test
        if layout == "column slice":
            return (mx.concatenate([y, other], axis=1).astype(mx.float32) * weights).sum()
        if layout == "transposed":
            return (y.astype(mx.float32).T @ mx.ones((n, 1)) * square).sum()
        return (y.astype(mx.float32).sum(axis=0) * row).sum()

    def loss(f, res, dense_ct):
        y = nn.norm_act(norm, x.replace(f), nn.ReLU(), res).feats
        if dense_ct is None:
            return head(y)
        return (y.astype(mx.float32) * dense_ct).sum()

    g_layout = mx.grad(loss, argnums=[0, 1])(x.feats, r, None)
    # the same cotangent, materialised as a contiguous array
    y0 = nn.norm_act(norm, x, nn.ReLU(), r).feats
    ct = mx.contiguous(mx.grad(head)(y0).astype(mx.float32))
    g_dense = mx.grad(loss, argnums=[0, 1])(x.feats, r, ct)
    for a, b in zip(g_layout, g_dense):
        np.testing.assert_array_equal(to_np(a), to_np(b))
    with fused_norms(False):
        g_ref = mx.grad(loss, argnums=[0, 1])(x.feats.astype(mx.float32), r.astype(mx.float32), ct)
    tol = TOLERANCES[dtype]
    for a, b in zip(g_layout, g_ref):
        scale = max(1.0, np.abs(to_np(b)).max())
        close = np.isclose(to_np(a) / scale, to_np(b) / scale, **tol)
        assert close.all() if dtype == mx.float32 else close.mean() > 0.999


@pytest.mark.usefixtures("on_cpu")  # thread counts are the CPU's; see docs/semantics.md for GPUs
def test_bitwise_identical_across_thread_counts(rng):
    x = tensor(rng, 5000, 37, batch=2)
    r = mx.array(rng.standard_normal((5000, 37)).astype(np.float32))

    def run():
        bn, inorm = nn.BatchNorm(37), nn.InstanceNorm(37)

        def loss(f, res):
            y = nn.norm_act(bn, x.replace(f), nn.ReLU(), res)
            z = nn.norm_act(inorm, y, nn.LeakyReLU(0.1))
            return (z.feats * z.feats).sum(), (y.feats, z.feats)

        (_, outs), grads = mx.value_and_grad(loss, argnums=[0, 1])(x.feats, r)
        return [np.array(a) for a in (*outs, *grads, bn.running_mean, bn.running_var)]

    before = mlx_lattice.num_threads()
    try:
        mlx_lattice.set_num_threads(1)
        one = run()
        mlx_lattice.set_num_threads(2)
        two = run()
    finally:
        mlx_lattice.set_num_threads(before)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


def test_empty_input_passes_through():
    x = SparseTensor(np.zeros((0, 4), np.int32), np.zeros((0, 5), np.float32))
    bn = nn.BatchNorm(5)
    assert nn.norm_act(bn, x, nn.ReLU()).feats.shape == (0, 5)
    assert nn.norm_act(nn.InstanceNorm(5), x, nn.ReLU()).feats.shape == (0, 5)
    np.testing.assert_array_equal(np.array(bn.running_mean), 0.0)


def test_unfusable_activation_and_no_affine(rng):
    x = tensor(rng, 200, 4)
    bn = nn.BatchNorm(4, affine=False)
    y = nn.norm_act(bn, x, nn.GELU())  # no fused GELU: modules in turn
    z = oracle(to_np(x.feats), 1.0, 0.0, np.zeros(200), "none")
    np.testing.assert_allclose(to_np(y.feats), to_np(nn.GELU()(mx.array(z.astype(np.float32)))), rtol=1e-4, atol=1e-4)
    y = nn.norm_act(nn.BatchNorm(4, affine=False), x, nn.ReLU())
    np.testing.assert_allclose(to_np(y.feats), np.maximum(z, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("on_cpu")  # calls the CPU primitive directly
def test_bad_arguments(rng):
    x = tensor(rng, 10, 3)
    with pytest.raises(TypeError, match="norm must be a BatchNorm or InstanceNorm"):
        nn.norm_act(nn.LayerNorm(3), x, nn.ReLU())
    with pytest.raises(ValueError, match="residual must match"):
        nn.norm_act(nn.BatchNorm(3), x, nn.ReLU(), mx.zeros((10, 4)))
    with pytest.raises(ValueError, match="features of shape"):
        nn.norm_act(nn.BatchNorm(4), x, nn.ReLU())
    f, w = mx.zeros((10, 3)), mx.ones((3,))
    with pytest.raises(ValueError, match="weight must have shape"):
        mlx_lattice._ext.norm_act(f, mx.ones((2,)), w, None, None, 1, None, None, 1e-5, 1, 0.0)
    with pytest.raises(ValueError, match="slope must be >= 0"):
        mlx_lattice._ext.norm_act(f, w, w, None, None, 1, None, None, 1e-5, 2, -0.5)
    with pytest.raises(ValueError, match="n_segments > 1 needs segment ids"):
        mlx_lattice._ext.norm_act(f, w, w, None, None, 2, None, None, 1e-5, 1, 0.0)


def test_minkunet_step_fused_matches_op_path(rng):
    coords = np.unique(rng.integers(0, 24, (1500, 3)), axis=0)
    coords = np.concatenate([np.zeros((len(coords), 1), np.int64), coords], 1).astype(np.int32)
    feats = mx.array(rng.standard_normal((len(coords), 4)).astype(np.float32))
    mx.random.seed(0)
    model = MinkUNet(4, 3, width=0.25)

    def loss(m, x):
        return (m(x).feats ** 2).mean()

    f = mnn.value_and_grad(model, loss)
    v1, g1 = f(model, SparseTensor(coords, feats))
    state1 = [np.array(v) for _, v in sorted(_running(model))]
    with fused_norms(False):
        v2, g2 = f(model, SparseTensor(coords, feats))
    np.testing.assert_allclose(to_np(v1), to_np(v2), rtol=1e-4)
    for (k, a), (_, b) in zip(tree_flatten(g1), tree_flatten(g2)):
        scale = max(1e-3, np.abs(to_np(b)).max())
        np.testing.assert_allclose(to_np(a) / scale, to_np(b) / scale, rtol=1e-3, atol=1e-3, err_msg=k)
    assert len(state1) > 20



def test_fused_norms_sets_every_backend_for_the_block():
    from mlx_lattice.nn import normalization as norm_mod

    names = ("FUSED_ON_CPU", "FUSED_ON_METAL", "FUSED_ON_CUDA")
    with fused_norms(False):
        assert not any(getattr(norm_mod, k) for k in names)
        with fused_norms(True):
            assert all(getattr(norm_mod, k) for k in names)
        assert not any(getattr(norm_mod, k) for k in names)
    assert all(getattr(norm_mod, k) for k in names)


def test_record_norms_collects_batch_and_instance_norm_calls(rng):
    from mlx_lattice.nn.normalization import record_norms

    x = tensor(rng, 50, 3)
    bn, inorm, relu = nn.BatchNorm(3), nn.InstanceNorm(3), nn.ReLU()
    with record_norms() as calls:
        y = nn.norm_act(bn, x, relu, residual=x)
        bn(x.feats)
        inorm(x)
    bn(x)  # after the block: recorded nowhere
    assert len(calls) == 3 and all(c.norm is m for c, m in zip(calls, (bn, bn, inorm)))
    assert all(c.x is x.feats and c.host_s > 0 for c in calls)
    assert calls[0].act is relu and calls[0].residual is x.feats
    assert calls[1].act is None and calls[1].residual is None
    assert y.feats.shape == (50, 3)


def _running(model):
    return [(k, v) for k, v in tree_flatten(model.state) if "running" in k]


@pytest.mark.parametrize("kind", ["batch", "batch-eval", "instance"])
def test_jvp_against_finite_differences(rng, kind):
    n, c = 40, 3
    x = tensor(rng, n, c, batch=3 if kind == "instance" else 1)
    norm = nn.InstanceNorm(c) if kind == "instance" else nn.BatchNorm(c)
    w, b = affine(rng, norm)
    groups = np.array(x.coords)[:, 0] if kind == "instance" else np.zeros(n)
    stats = None
    if kind == "batch-eval":
        norm.running_mean = mx.array(rng.standard_normal(c).astype(np.float32))
        norm.running_var = mx.array(rng.uniform(0.5, 2, c).astype(np.float32))
        stats = (to_np(norm.running_mean), to_np(norm.running_var))
        norm.eval()
    r = rng.standard_normal((n, c))
    tx, tw, tb, tr = (rng.standard_normal(s) for s in ((n, c), (c,), (c,), (n, c)))
    xf = to_np(x.feats)

    def f_mx(xv, wv, bv, rv):
        norm.weight, norm.bias = wv, bv
        return nn.norm_act(norm, x.replace(xv), nn.LeakyReLU(0.3), rv).feats

    prim = [mx.array(a.astype(np.float32)) for a in (xf, w, b, r)]
    tans = [mx.array(a.astype(np.float32)) for a in (tx, tw, tb, tr)]
    (_,), (ty,) = mx.jvp(lambda *a: [f_mx(*a)], prim, tans)
    h = 1e-6

    def leaky(t):  # the oracle along the tangent, LeakyReLU slope 0.3
        z = oracle(xf + t * tx, w + t * tw, b + t * tb, groups, "none", r + t * tr, stats=stats)
        return np.where(z > 0, z, 0.3 * z)

    fd = (leaky(h) - leaky(-h)) / (2 * h)
    np.testing.assert_allclose(to_np(ty), fd, rtol=2e-3, atol=2e-3)


def test_compiled_training_step_matches_eager(rng):
    x = tensor(rng, 400, 6)
    bn1, bn2 = nn.BatchNorm(6), nn.BatchNorm(6)

    def step(bn, a):
        return (nn.norm_act(bn, x.replace(a), nn.ReLU()).feats ** 2).sum()

    eager = mx.grad(lambda a: step(bn1, a))(x.feats)
    compiled = mx.compile(mx.grad(lambda a: step(bn2, a)), inputs=bn2.state, outputs=bn2.state)(x.feats)
    np.testing.assert_allclose(np.array(compiled), np.array(eager), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(bn2.running_mean), np.array(bn1.running_mean), rtol=1e-6)


@pytest.mark.usefixtures("on_cpu")  # calls the CPU primitive directly
@pytest.mark.parametrize("segmented", [False, True])
def test_statistics_with_large_offset_over_many_chunks(rng, segmented):
    # mean^2 >> var: a single-pass sum of squares would lose the variance;
    # many 256-row chunks, segment ids unsorted (runs of one row) or absent.
    n, c = 20000, 19
    x = (1000.0 + rng.standard_normal(c) * 50 + rng.standard_normal((n, c)) * 0.01).astype(np.float32)
    seg = rng.integers(0, 3, n).astype(np.int32) if segmented else np.zeros(n, np.int32)
    s = 3 if segmented else 1
    w, b = mx.ones((c,)), mx.zeros((c,))
    _, mean, var = mlx_lattice._ext.norm_act(
        mx.array(x), w, b, None, mx.array(seg) if segmented else None, s, None, None, 1e-5, 0, 0.0
    )
    xd = x.astype(np.float64)
    for g in range(s):
        rows = xd[seg == g]
        np.testing.assert_allclose(np.array(mean)[g], rows.mean(0), rtol=1e-7)
        np.testing.assert_allclose(np.array(var)[g], rows.var(0), rtol=1e-5)


@pytest.mark.usefixtures("on_cpu")  # calls the CPU primitive directly
@pytest.mark.parametrize("isa", mlx_lattice._ext.supported_cpu_isas())
def test_normalisation_accurate_with_large_mean(rng, isa):
    # Large mean, small spread: z = x * scale + (b - mean * scale) would lose
    # about mean * scale * 2^-24 (1e-2 here); centring first keeps z within a
    # few ulps of the float64 value from the kernel's own statistics, and the
    # backward pass (which recomputes z's sign) gates where the forward clamped.
    n, c = 20000, 19
    x = (1000.0 + rng.standard_normal(c) * 50 + rng.standard_normal((n, c)) * 0.01).astype(np.float32)
    w = mx.array(rng.uniform(0.5, 1.5, c).astype(np.float32))
    b = mx.array(rng.standard_normal(c).astype(np.float32))
    ct = mx.array(rng.standard_normal((n, c)).astype(np.float32))
    previous = mlx_lattice._ext.cpu_isa()
    try:
        mlx_lattice._ext.set_cpu_isa(isa)

        def f(x, w, b):
            return mlx_lattice._ext.norm_act(x, w, b, None, None, 1, None, None, 1e-5, 1, 0.0)

        (y, mean, var), (_, _, db) = mx.vjp(f, [mx.array(x), w, b], [ct, mx.zeros((1, c)), mx.zeros((1, c))])
        y, db = np.array(y), np.array(db)
    finally:
        mlx_lattice._ext.set_cpu_isa(previous)
    m, v = np.array(mean, np.float64)[0], np.array(var, np.float64)[0]
    z = (x - m) / np.sqrt(v + 1e-5) * np.array(w, np.float64) + np.array(b, np.float64)
    assert np.abs(y - np.maximum(z, 0)).max() < 4e-6
    # against the exact statistics: bounded by the float32 mean's rounding
    xd = x.astype(np.float64)
    exact = (xd - xd.mean(0)) / np.sqrt(xd.var(0) + 1e-5) * np.array(w, np.float64) + np.array(b, np.float64)
    assert np.abs(y - np.maximum(exact, 0)).max() < 0.006 * 1.5
    # the backward pass gates with the forward's z: db sums ct where y > 0
    ref_db = (np.array(ct, np.float64) * (y > 0)).sum(0)
    np.testing.assert_allclose(db, ref_db, rtol=1e-5, atol=1e-3)


@pytest.mark.skipif(
    not {"avx2", "avx512"} <= set(mlx_lattice._ext.supported_cpu_isas()), reason="needs AVX2 and AVX-512"
)
@pytest.mark.usefixtures("on_cpu")  # calls the CPU primitive directly
def test_bitwise_identical_across_fma_paths(rng):
    # AVX2 and AVX-512 run the same 8-float row vectors with FMA: same bits
    # (the baseline path has no FMA and rounds differently).
    x = rng.standard_normal((3000, 37)).astype(np.float32) * 2 + 1
    r = rng.standard_normal((3000, 37)).astype(np.float32)
    ct = mx.array(rng.standard_normal((3000, 37)).astype(np.float32))
    w = mx.array(rng.uniform(0.5, 1.5, 37).astype(np.float32))
    b = mx.array(rng.standard_normal(37).astype(np.float32))
    seg = mx.array(rng.integers(0, 2, 3000).astype(np.int32))
    previous = mlx_lattice._ext.cpu_isa()
    results = []
    try:
        for isa in ("avx2", "avx512"):
            mlx_lattice._ext.set_cpu_isa(isa)
            out = []
            for res, segs in ((None, None), (mx.array(r), None), (None, seg)):
                def f(x, w, b, res=res, segs=segs):
                    return mlx_lattice._ext.norm_act(
                        x, w, b, res, segs, 1 if segs is None else 2, None, None, 1e-5, 1, 0.0
                    )[0]

                y, g = mx.vjp(f, [mx.array(x), w, b], [ct])
                out += [np.array(a) for a in (*y, *g)]
            results.append(out)
    finally:
        mlx_lattice._ext.set_cpu_isa(previous)
    for a, b_ in zip(*results):
        assert a.tobytes() == b_.tobytes()


def _running_oracle(rm, rv, mean, var, mu, n):
    """The running statistics as MLX's float32 ops round them, one operation
    at a time in NumPy float32: keep * rm + mu * mean and keep * rv + mu *
    (var * ratio), with keep, mu and ratio rounded to float32 first."""
    f = np.float32
    m, ratio = f(mu), f(n / (n - 1))
    # a Python scalar takes the running statistics' dtype (float16 products
    # round to float16 before the sum promotes to float32)
    keep = np.asarray(rm).dtype.type(1 - mu)
    rm, rv = (np.asarray(a).reshape(-1) for a in (rm, rv))
    mean, var = (np.asarray(a, np.float32).reshape(-1) for a in (mean, var))
    return (keep * rm).astype(f) + m * mean, (keep * rv).astype(f) + m * (var * ratio)


@pytest.mark.usefixtures("on_cpu")  # calls the CPU primitive directly
@pytest.mark.parametrize("c", [1, 5, 16, 67])
def test_running_stats_bits(rng, c):
    mu, n = 0.1, 97
    rm = rng.standard_normal(c).astype(np.float32)
    rv = rng.uniform(0.5, 2, c).astype(np.float32)
    mean = rng.standard_normal((1, c)).astype(np.float32)
    var = rng.uniform(0.1, 3, (1, c)).astype(np.float32)
    # strided running statistics (every other element of a longer array)
    rv_wide = np.repeat(rv, 2)
    args = [mx.array(rm), mx.array(rv_wide)[::2], mx.array(mean), mx.array(var)]
    new_mean, new_var = mlx_lattice._ext.running_stats(*args, 1 - mu, mu, n / (n - 1))
    exp_mean, exp_var = _running_oracle(rm, rv, mean, var, mu, n)
    assert new_mean.shape == (c,) and new_var.shape == (c,)
    np.testing.assert_array_equal(np.array(new_mean), exp_mean)
    np.testing.assert_array_equal(np.array(new_var), exp_var)
    # the same bits as the expression in MLX ops (what BatchNorm ran before)
    ref_mean = (1 - mu) * args[0] + mu * args[2][0]
    ref_var = (1 - mu) * args[1] + mu * (args[3][0] * (n / (n - 1)))
    np.testing.assert_array_equal(np.array(new_mean), np.array(ref_mean))
    np.testing.assert_array_equal(np.array(new_var), np.array(ref_var))


@pytest.mark.usefixtures("on_cpu")
def test_running_stats_no_gradient_and_bad_input():
    a = mx.ones((4,))
    g = mx.grad(lambda m: mlx_lattice._ext.running_stats(a, a, m, a, 0.9, 0.1, 2.0)[0].sum())(mx.ones((1, 4)))
    np.testing.assert_array_equal(np.array(g), 0.0)
    with pytest.raises(ValueError, match="running_stats: mean must be float32"):
        mlx_lattice._ext.running_stats(a.astype(mx.float16), a, a, a, 0.9, 0.1, 2.0)
    with pytest.raises(ValueError, match="running_stats: batch_var must hold C elements"):
        mlx_lattice._ext.running_stats(a, a, a, mx.ones((5,)), 0.9, 0.1, 2.0)


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_batch_norm_running_stats_over_steps(rng, dtype):
    """Three training steps: the running statistics are the oracle's float32
    roundings of the kernel's batch statistics (float16 modules keep MLX's
    expression and its promotion to float32)."""
    n, c = 300, 6
    bn = nn.BatchNorm(c, momentum=0.2)
    if dtype != mx.float32:
        bn.set_dtype(dtype)
    rm, rv = np.array(bn.running_mean), np.array(bn.running_var)  # float16 kept
    for _ in range(3):
        x = tensor(rng, n, c).feats.astype(dtype)
        w, b = mx.ones((c,)), mx.zeros((c,))
        _, mean, var = mlx_lattice._ext.norm_act(x, w, b, None, None, 1, None, None, bn.eps, 1, 0.0)
        nn.norm_act(bn, x, nn.ReLU())
        rm, rv = _running_oracle(rm, rv, np.array(mean), np.array(var), 0.2, n)
        assert bn.running_mean.dtype == mx.float32
        np.testing.assert_array_equal(to_np(bn.running_mean), rm)
        np.testing.assert_array_equal(to_np(bn.running_var), rv)


def _bits(a):
    return np.array(a.view(mx.uint16) if a.dtype in (mx.float16, mx.bfloat16) else a).tobytes()


def _graph(*arrays):
    buf = __import__("io").StringIO()
    mx.export_to_dot(buf, *arrays)
    import re
    from collections import Counter

    return Counter(re.findall(r'label ="([^"]*)", shape=rectangle', buf.getvalue()))


@pytest.mark.usefixtures("on_cpu")  # the CPU folds the running update into the norm
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_norm_act_running_is_the_norm_then_running_stats(rng, residual, dtype):
    """One primitive forward and one backward: the bits of norm_act then
    running_stats (y, gradients, new running statistics), and the
    statistics take no gradient."""
    ext = mlx_lattice._ext
    n, c, mu = 400, 21, 0.1
    x = mx.array((rng.standard_normal((n, c)) * 2 + 1).astype(np.float32)).astype(dtype)
    r = mx.array(rng.standard_normal((n, c)).astype(np.float32)).astype(dtype) if residual else None
    w = mx.array(rng.uniform(0.5, 1.5, c).astype(np.float32))
    b = mx.array(rng.standard_normal(c).astype(np.float32))
    rm = mx.array(rng.standard_normal(c).astype(np.float32))
    rv = mx.array(rng.uniform(0.5, 2, c).astype(np.float32))
    ct = mx.array(rng.standard_normal((n, c)).astype(np.float32)).astype(dtype)
    keep, ratio = 1 - mu, n / (n - 1)

    def folded(x, w, b):
        return ext.norm_act_running(x, w, b, r, 1e-5, 1, 0.0, rm, rv, keep, mu, ratio)

    def separate(x, w, b):
        y, mean, var = ext.norm_act(x, w, b, r, None, 1, None, None, 1e-5, 1, 0.0)
        return [y, *ext.running_stats(rm, rv, mean, var, keep, mu, ratio)]

    outs = []
    for fn in (folded, separate):
        y, grads = mx.vjp(lambda *a: fn(*a)[0], [x, w, b], [ct])
        outs.append([y[0], *fn(x, w, b)[1:], *grads])
    mx.eval(outs)
    for a, e in zip(*outs):
        assert _bits(a) == _bits(e)
    y, nm, nv = folded(x, w, b)
    assert dict(_graph(y, nm, nv)) == {"SparseNormAct": 1}
    assert _graph(*mx.vjp(lambda *a: folded(*a)[0], [x, w, b], [ct])[1])["SparseNormActGrad"] == 1
    assert "Full" not in _graph(*mx.vjp(lambda *a: folded(*a)[0], [x, w, b], [ct])[1])
    # the running statistics carry no gradient, forward or reverse
    g = mx.grad(lambda x: (folded(x, w, b)[1] ** 2).sum())(x)
    np.testing.assert_array_equal(np.array(g.astype(mx.float32)), 0.0)
    _, (t_y, t_m, t_v) = mx.jvp(lambda x: folded(x, w, b), [x], [x * 0.5])
    np.testing.assert_array_equal(np.array(t_m), 0.0)
    np.testing.assert_array_equal(np.array(t_v), 0.0)
    _, (t_e,) = mx.jvp(lambda x: separate(x, w, b)[0], [x], [x * 0.5])
    np.testing.assert_allclose(np.array(t_y.astype(mx.float32)), np.array(t_e.astype(mx.float32)))
    with pytest.raises(ValueError, match="running_mean must be float32"):
        ext.norm_act_running(x, w, b, None, 1e-5, 1, 0.0, rm.astype(mx.float16), rv, keep, mu, ratio)
    with pytest.raises(ValueError, match="running_var must hold C elements"):
        ext.norm_act_running(x, w, b, None, 1e-5, 1, 0.0, rm, rv[:3], keep, mu, ratio)


@pytest.mark.usefixtures("on_cpu")  # the CPU primitive's statistics gradients
def test_statistics_without_gradient(rng):
    """stats_grad=False (the layers' call): the backward pass takes no
    cotangents for the statistics, gives x, w, b the bits of the call
    whose statistics' cotangents are zero, and no gradient through them."""
    ext = mlx_lattice._ext
    n, c = 300, 7
    x = mx.array(rng.standard_normal((n, c)).astype(np.float32))
    w, b = mx.ones((c,)), mx.zeros((c,))
    ct = mx.array(rng.standard_normal((n, c)).astype(np.float32))
    res = {}
    for flag in (True, False):
        def f(x, w, b, flag=flag):
            return ext.norm_act(x, w, b, None, None, 1, None, None, 1e-5, 2, 0.1, stats_grad=flag)[0]

        res[flag] = mx.vjp(f, [x, w, b], [ct])[1]
        graph = _graph(*res[flag])
        assert ("Full" in graph) == flag  # the zero cotangents of the statistics, made by MLX
        mx.eval(res[flag])
    for a, e in zip(res[False], res[True]):
        assert _bits(a) == _bits(e)
    g = mx.grad(lambda x: ext.norm_act(x, w, b, None, None, 1, None, None, 1e-5, 1, 0.0,
                                       stats_grad=False)[1].sum())(x)
    np.testing.assert_array_equal(np.array(g), 0.0)


@pytest.mark.usefixtures("on_cpu")  # the CPU tasks copy what they cannot read in place
@pytest.mark.parametrize("training", [True, False])
def test_norm_inputs_in_any_layout(rng, training):
    """Transposed x and residual, strided affine parameters and statistics:
    read as they come (no Contiguous node in the graph), the bits of their
    dense copies."""
    ext = mlx_lattice._ext
    n, c = 250, 9
    xt = mx.array(rng.standard_normal((c, n)).astype(np.float32)).T
    rt = mx.array(rng.standard_normal((c, n)).astype(np.float32)).T
    wide = mx.array(rng.uniform(0.5, 1.5, 2 * c).astype(np.float32))
    w, b = wide[::2], wide[1::2]
    stats = (None, None) if training else (wide[::2] - 1, wide[1::2])
    ct = mx.array(rng.standard_normal((n, c)).astype(np.float32))
    outs = []
    for args in ((xt, w, b, rt), tuple(mx.contiguous(a) for a in (xt, w, b, rt))):
        def f(x, w, b, r, args=args):
            return ext.norm_act(x, w, b, r, None, 1, *stats, 1e-5, 1, 0.0)[0]

        y, grads = mx.vjp(f, list(args), [ct])
        outs.append([y[0], *grads])
        if args[0] is xt:
            assert "Contiguous" not in _graph(y[0], *grads)
    mx.eval(outs)
    for a, e in zip(*outs):
        assert _bits(a) == _bits(e)
