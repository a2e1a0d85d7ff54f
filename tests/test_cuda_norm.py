"""Batch / instance norm + activation (+ residual) as CUDA kernels
(mlx_lattice/backends/cuda/norm.py) against a float64 NumPy oracle written here and
against the MLX-op path of the same layers. Skipped without a CUDA device,
but for the argument checks, which run before any kernel.

The oracle's gradients are the closed-form ones of y = act(w xhat + b + r),
derived here independently of the kernels and checked against central
differences of the oracle on a small case.
"""

import numpy as np
import pytest
import mlx.core as mx
import mlx.nn as mnn
from mlx.utils import tree_flatten

from mlx_lattice import SparseTensor, nn
from mlx_lattice.backends.cuda import norm as cuda_norm
from mlx_lattice.bench.cuda_profile import graph_nodes
from mlx_lattice.models import MinkUNet
from mlx_lattice.nn.normalization import fused_norms

from conftest import TOLERANCES, assert_same, check_statistics_gradients, needs_cuda, to_np

ACTS = {"none": (None, 1.0), "relu": (nn.ReLU(), 0.0), "leaky": (nn.LeakyReLU(0.2), 0.2)}
EPS = 1e-5


def forward64(x, w, b, groups, low, r=None, stats=None):
    """(y, z, xhat, inv, mean, var): float64, statistics per group of rows
    (biased variance) or the given (mean, var)."""
    x = np.asarray(x, np.float64)
    xhat = np.empty_like(x)
    inv = np.empty_like(x)
    means, vars_ = {}, {}
    for g in np.unique(groups):
        sel = groups == g
        mean, var = (x[sel].mean(0), x[sel].var(0)) if stats is None else stats
        means[g], vars_[g] = mean, var
        inv[sel] = 1 / np.sqrt(var + EPS)
        xhat[sel] = (x[sel] - mean) * inv[sel]
    z = xhat * w + b + (0 if r is None else r)
    y = np.where(z > 0, z, low * z)
    return y, z, xhat, inv, means, vars_


def backward64(ct, z, xhat, inv, w, groups, low, training):
    """(dx, dw, db, dr) of sum(y * ct)."""
    g = np.where(z > 0, ct, low * ct)
    dx = np.empty_like(g)
    for s in np.unique(groups):
        sel = groups == s
        gs, xs = g[sel], xhat[sel]
        if training:
            n = sel.sum()
            dx[sel] = w * inv[sel] * (gs - gs.mean(0) - xs * (gs * xs).mean(0))
        else:
            dx[sel] = w * inv[sel] * gs
    return dx, (g * xhat).sum(0), g.sum(0), g


def features(rng, n, c, dtype, offset=0.0):
    x = rng.standard_normal((n, c)) * 3 + rng.standard_normal(c) + offset
    return mx.array(x.astype(np.float32)).astype(dtype)


def batch_ids(rng, n, batch):
    """Batch item of each row, in random order (rows of an item are not contiguous)."""
    return rng.integers(0, batch, n).astype(np.int32) if batch > 1 else np.zeros(n, np.int32)


def sparse(x, ids):
    coords = np.zeros((len(ids), 4), np.int32)
    coords[:, 0] = ids
    coords[:, 1] = np.arange(len(ids))
    return SparseTensor(coords, x)


def make_norm(rng, kind, c, dtype):
    norm = nn.InstanceNorm(c) if kind == "instance" else nn.BatchNorm(c, momentum=0.3)
    norm.weight = mx.array(rng.uniform(0.5, 1.5, c).astype(np.float32))
    norm.bias = mx.array(rng.standard_normal(c).astype(np.float32))
    if kind == "batch-eval":
        norm.running_mean = mx.array(rng.standard_normal(c).astype(np.float32))
        norm.running_var = mx.array(rng.uniform(0.5, 2, c).astype(np.float32))
        norm.eval()
    if dtype != mx.float32:
        norm.set_dtype(dtype)
    return norm


def run_layer(norm, xs, act, r, ct):
    """(y, [dx, dweight, dbias, dresidual]) of sum(y * ct) through nn.norm_act."""

    def loss(f, w, b, *res):
        norm.weight, norm.bias = w, b
        y = nn.norm_act(norm, xs.replace(f), act, *res).feats
        return (y.astype(mx.float32) * ct).sum(), y

    args = [xs.feats, norm.weight, norm.bias] + ([] if r is None else [r])
    (_, y), grads = mx.value_and_grad(loss, argnums=list(range(len(args))))(*args)
    return y, grads


def assert_close(got, want, dtype, what, strict=True):
    tol = TOLERANCES[dtype]
    scale = max(1.0, np.abs(want).max())
    a, b = to_np(got) / scale, want / scale
    if strict or dtype == mx.float32:
        np.testing.assert_allclose(a, b, **tol, err_msg=what)
    else:
        # half-precision inputs round the pre-activation: a few values next
        # to 0 land on the other side of the activation's kink
        assert np.isclose(a, b, **tol).mean() > 0.995, what


@pytest.mark.cuda
@needs_cuda
@pytest.mark.usefixtures("on_gpu")
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("kind", ["batch", "batch-eval", "instance"])
@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("n,c", [(1, 3), (5000, 33), (700, 65)])
def test_values_and_gradients_against_oracle(rng, dtype, kind, act, residual, n, c):
    batch = 3 if kind == "instance" else 1
    if kind == "instance" and n == 1:
        batch = 1
    ids = batch_ids(rng, n, batch)
    xs = sparse(features(rng, n, c, dtype), ids)
    norm = make_norm(rng, kind, c, dtype)
    module, low = ACTS[act]
    r = features(rng, n, c, dtype) if residual else None
    ct = mx.array(rng.standard_normal((n, c)).astype(np.float32))
    stats = None
    if kind == "batch-eval":
        stats = (to_np(norm.running_mean), to_np(norm.running_var))
    w, b = to_np(norm.weight), to_np(norm.bias)
    groups = ids if kind == "instance" else np.zeros(n, np.int32)
    y, grads = run_layer(norm, xs, module, r, ct)
    assert y.dtype == dtype
    want, z, xhat, inv, means, vars_ = forward64(to_np(xs.feats), w, b, groups, low,
                                                 None if r is None else to_np(r), stats)
    assert_close(y, want, dtype, "y")
    dx, dw, db, dr = backward64(to_np(ct), z, xhat, inv, w, groups, low, stats is None)
    names = ["dx", "dweight", "dbias", "dresidual"]
    for i, (got, ref) in enumerate(zip(grads, (dx, dw, db, dr))):
        assert got.dtype == dtype, names[i]
        # weight / bias gradients are sums over rows: relative to their size
        assert_close(got, ref, dtype, names[i], strict=i in (1, 2) and dtype == mx.float32)
    if kind == "batch" and n > 1:
        # momentum update with the unbiased variance
        tol = TOLERANCES[dtype] if dtype != mx.float32 else dict(rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(to_np(norm.running_mean), 0.3 * means[0], **tol)
        np.testing.assert_allclose(to_np(norm.running_var), 0.7 + 0.3 * vars_[0] * n / (n - 1), **tol)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.usefixtures("on_gpu")
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("kind", ["batch", "batch-eval", "instance"])
def test_matches_op_path(rng, dtype, kind):
    """Values, all gradients and the running statistics against the MLX-op
    path of the same layers on the same inputs."""
    n, c = 3000, 19
    ids = batch_ids(rng, n, 3 if kind == "instance" else 1)
    xs = sparse(features(rng, n, c, dtype), ids)
    r = features(rng, n, c, dtype)
    ct = mx.array(rng.standard_normal((n, c)).astype(np.float32))
    one, two = make_norm(np.random.default_rng(1), kind, c, dtype), make_norm(np.random.default_rng(1), kind, c, dtype)
    y1, g1 = run_layer(one, xs, nn.ReLU(), r, ct)
    with fused_norms(False):
        y2, g2 = run_layer(two, xs, nn.ReLU(), r, ct)
    assert_close(y1, to_np(y2), dtype, "y")
    for i, (a, b) in enumerate(zip(g1, g2)):
        assert_close(a, to_np(b), dtype, f"gradient {i}", strict=dtype == mx.float32 or i in (1, 2))
    if kind == "batch":
        tol = TOLERANCES[dtype] if dtype != mx.float32 else dict(rtol=1e-5, atol=1e-6)
        for k in ("running_mean", "running_var"):
            np.testing.assert_allclose(to_np(getattr(one, k)), to_np(getattr(two, k)), **tol)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.usefixtures("on_gpu")
def test_hook_takes_the_cuda_kernels(rng, monkeypatch):
    # a training batch norm with running statistics: norm_act_running;
    # without, and an instance norm: norm_act_layer
    calls = []
    for name in ("norm_act_layer", "norm_act_running"):
        monkeypatch.setattr(cuda_norm, name, lambda *a, f=getattr(cuda_norm, name): calls.append(1) or f(*a))
    xs = sparse(features(rng, 50, 4, mx.float32), batch_ids(rng, 50, 2))
    nn.norm_act(nn.BatchNorm(4), xs, nn.ReLU())
    nn.norm_act(nn.BatchNorm(4, track_running_stats=False), xs, nn.ReLU())
    nn.norm_act(nn.InstanceNorm(4), xs, nn.LeakyReLU(0.1))
    assert len(calls) == 3
    with fused_norms(False):
        nn.norm_act(nn.BatchNorm(4), xs, nn.ReLU())
    nn.norm_act(nn.BatchNorm(4), xs, nn.GELU())  # no fused GELU: MLX ops
    assert len(calls) == 3


@pytest.mark.cuda
@needs_cuda
@pytest.mark.usefixtures("on_gpu")
@pytest.mark.parametrize("kind", ["batch", "batch-eval", "instance"])
def test_gradients_against_finite_differences(rng, kind):
    """The oracle's closed-form gradients and the kernels', against central
    differences of the oracle (also the eval mode's statistics inputs)."""
    n, c = 9, 3
    ids = batch_ids(rng, n, 2 if kind == "instance" else 1)
    groups = ids if kind == "instance" else np.zeros(n, np.int32)
    x = rng.standard_normal((n, c)) * 2
    w, b = rng.uniform(0.5, 1.5, c), rng.standard_normal(c)
    r = rng.standard_normal((n, c))
    ct = rng.standard_normal((n, c))
    mean, var = rng.standard_normal(c), rng.uniform(0.5, 2, c)
    eval_mode = kind == "batch-eval"

    def f_np(xv, wv, bv, rv, mv, vv):
        y = forward64(xv, wv, bv, groups, 0.2, rv, (mv, vv) if eval_mode else None)[0]
        return (y * ct).sum()

    def f_mx(xv, wv, bv, rv, mv, vv):
        seg = mx.array(ids) if kind == "instance" else None
        out = cuda_norm.norm_act(xv, wv, bv, rv, seg, 2 if kind == "instance" else 1,
                                 mv if eval_mode else None, vv if eval_mode else None, EPS, 2, 0.2)
        return (out[0] * mx.array(ct.astype(np.float32))).sum()

    args = [x, w, b, r, mean, var]
    argnums = [0, 1, 2, 3] + ([4, 5] if eval_mode else [])
    grads = mx.grad(f_mx, argnums=argnums)(*[mx.array(a.astype(np.float32)) for a in args])
    _, z, xhat, inv, _, _ = forward64(x, w, b, groups, 0.2, r, (mean, var) if eval_mode else None)
    closed = backward64(ct, z, xhat, inv, w, groups, 0.2, not eval_mode)
    h = 1e-6
    for k, i in enumerate(argnums):
        fd = np.zeros_like(args[i])
        for idx in np.ndindex(*args[i].shape):
            up = [np.array(a, copy=True) for a in args]
            dn = [np.array(a, copy=True) for a in args]
            up[i][idx] += h
            dn[i][idx] -= h
            fd[idx] = (f_np(*up) - f_np(*dn)) / (2 * h)
        np.testing.assert_allclose(to_np(grads[k]), fd, rtol=2e-3, atol=2e-3, err_msg=f"argument {i}")
        if i < 4:
            np.testing.assert_allclose(closed[i], fd, rtol=1e-5, atol=1e-5, err_msg=f"oracle {i}")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.usefixtures("on_gpu")
@pytest.mark.parametrize("kind", ["batch", "instance", "batch-eval"])
@pytest.mark.parametrize("residual", [False, True])
def test_layer_form_equals_the_contract_bitwise(rng, kind, residual):
    """norm_act_layer (the layers' form: statistics without gradient, one
    output to differentiate) gives the same bits as norm_act for y, the
    statistics, every gradient of y and its forward-mode derivative."""
    n, c, s = 300, 5, 3 if kind == "instance" else 1
    seg = mx.array(batch_ids(rng, n, s)) if kind == "instance" else None
    st = [mx.array(rng.standard_normal(c).astype(np.float32)), mx.array(rng.uniform(0.5, 2, c).astype(np.float32))] \
        if kind == "batch-eval" else [None, None]
    prim = [mx.array(rng.standard_normal(a).astype(np.float32)).astype(mx.float16)
            for a in ((n, c), (c,), (c,), (n, c))]
    ct = mx.array(rng.standard_normal((n, c)).astype(np.float32)).astype(mx.float16)

    def run(fn):
        def y(x, w, b, r):
            return fn(x, w, b, r if residual else None, seg, s, *st, EPS, 2, 0.3)[0]
        outs = fn(*prim[:3], prim[3] if residual else None, seg, s, *st, EPS, 2, 0.3)
        _, vjps = mx.vjp(lambda *a: [y(*a)], prim, [ct])
        _, jvps = mx.jvp(lambda *a: [y(*a)], prim, [p * 0.5 for p in prim])
        return [*outs, *vjps[:3], *(vjps[3:] if residual else []), *jvps]

    full, layer = run(cuda_norm.norm_act), run(cuda_norm.norm_act_layer)
    assert len(full) == len(layer)
    for a, b in zip(full, layer):
        assert_same(a, b)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.usefixtures("on_gpu")
def test_gradients_through_statistics_outputs(rng):
    check_statistics_gradients(cuda_norm.norm_act, rng)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.usefixtures("on_gpu")
@pytest.mark.parametrize("kind", ["batch", "batch-eval", "instance"])
def test_jvp_against_finite_differences(rng, kind):
    n, c = 40, 3
    ids = batch_ids(rng, n, 3 if kind == "instance" else 1)
    groups = ids if kind == "instance" else np.zeros(n, np.int32)
    eval_mode = kind == "batch-eval"
    x, r = rng.standard_normal((n, c)), rng.standard_normal((n, c))
    w, b = rng.uniform(0.5, 1.5, c), rng.standard_normal(c)
    stats = (rng.standard_normal(c), rng.uniform(0.5, 2, c)) if eval_mode else None
    tans = [rng.standard_normal(a.shape) for a in (x, w, b, r)]

    def f_mx(xv, wv, bv, rv):
        seg = mx.array(ids) if kind == "instance" else None
        st = [mx.array(s.astype(np.float32)) for s in stats] if eval_mode else [None, None]
        return cuda_norm.norm_act(xv, wv, bv, rv, seg, 3 if kind == "instance" else 1, *st, EPS, 2, 0.3)[0]

    prim = [mx.array(a.astype(np.float32)) for a in (x, w, b, r)]
    (_,), (ty,) = mx.jvp(lambda *a: [f_mx(*a)], prim, [mx.array(t.astype(np.float32)) for t in tans])
    h = 1e-6

    def along(t):
        return forward64(x + t * tans[0], w + t * tans[1], b + t * tans[2], groups, 0.3, r + t * tans[3], stats)[0]

    np.testing.assert_allclose(to_np(ty), (along(h) - along(-h)) / (2 * h), rtol=2e-3, atol=2e-3)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.usefixtures("on_gpu")
@pytest.mark.parametrize("segmented", [False, True])
def test_statistics_with_large_offset_over_many_chunks(rng, segmented):
    # mean^2 >> var: a single-pass sum of squares would lose the variance;
    # many chunks, segment ids unsorted (runs of one row) or absent.
    n, c = 20000, 19
    x = (1000.0 + rng.standard_normal(c) * 50 + rng.standard_normal((n, c)) * 0.01).astype(np.float32)
    seg = rng.integers(0, 3, n).astype(np.int32)
    s = 3 if segmented else 1
    _, mean, var = cuda_norm.norm_act(mx.array(x), mx.ones((c,)), mx.zeros((c,)), None,
                                      mx.array(seg) if segmented else None, s, None, None, EPS, 0, 0.0)
    xd = x.astype(np.float64)
    for g in range(s):
        rows = xd[seg == g] if segmented else xd
        np.testing.assert_allclose(np.array(mean)[g], rows.mean(0), rtol=1e-7)
        np.testing.assert_allclose(np.array(var)[g], rows.var(0), rtol=1e-5)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.usefixtures("on_gpu")
def test_empty_batch_item_and_single_rows(rng):
    """A batch item with no rows gets zero statistics; a single-row item
    normalises to the bias."""
    x = features(rng, 5, 4, mx.float32)
    seg = mx.array(np.array([0, 0, 0, 0, 2], np.int32))
    w, b = mx.ones((4,)), mx.array(rng.standard_normal(4).astype(np.float32))
    y, mean, var = cuda_norm.norm_act(x, w, b, None, seg, 3, None, None, EPS, 0, 0.0)
    np.testing.assert_array_equal(np.array(mean)[1], 0.0)
    np.testing.assert_array_equal(np.array(var)[1:], 0.0)
    # z = x * scale + shift with scale = 1 / sqrt(eps): rounding of the two terms
    np.testing.assert_allclose(np.array(y)[4], np.array(b), rtol=0, atol=1e-4)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.usefixtures("on_gpu")
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_bitwise_repeatable(rng, dtype):
    n, c = 7000, 37
    ids = batch_ids(rng, n, 2)
    xs = sparse(features(rng, n, c, dtype, offset=20.0), ids)
    r = features(rng, n, c, dtype)

    def run():
        bn, inorm = nn.BatchNorm(c), nn.InstanceNorm(c)
        if dtype != mx.float32:
            bn.set_dtype(dtype)
            inorm.set_dtype(dtype)

        def loss(f, res):
            y = nn.norm_act(bn, xs.replace(f), nn.ReLU(), res)
            z = nn.norm_act(inorm, y, nn.LeakyReLU(0.1))
            return (z.feats.astype(mx.float32) ** 2).sum(), (y.feats, z.feats)

        (_, outs), grads = mx.value_and_grad(loss, argnums=[0, 1])(xs.feats, r)
        return [np.array(a.astype(mx.float32)) for a in (*outs, *grads, bn.running_mean, bn.running_var)]

    one, two = run(), run()
    for a, b in zip(one, two):
        assert a.tobytes() == b.tobytes()


def minkunet_graph(rng, fused):
    coords = np.unique(rng.integers(0, 24, (1500, 3)), axis=0)
    coords = np.concatenate([np.zeros((len(coords), 1), np.int64), coords], 1).astype(np.int32)
    feats = mx.array(rng.standard_normal((len(coords), 4)).astype(np.float32)).astype(mx.float16)
    mx.random.seed(0)
    model = MinkUNet(4, 4, width=0.5)
    model.set_dtype(mx.float16)

    def loss(m, x):
        return (m(x).feats.astype(mx.float32) ** 2).mean()

    with fused_norms(fused):
        value, grads = mnn.value_and_grad(model, loss)(model, SparseTensor(coords, feats))
    return graph_nodes(value, grads, model.parameters()), value, grads


@pytest.mark.cuda
@needs_cuda
@pytest.mark.usefixtures("on_gpu")
def test_minkunet_step_graph_is_smaller(rng, capsys):
    """A MinkUNet 0.5x float16 training step (forward + backward, running
    statistics): primitives in its graph on the CUDA norm path and on the
    MLX-op path, and the same loss (float16 gradients of a deep network
    drift apart across ReLU kinks; test_norm_act's MinkUNet test compares
    them in float32)."""
    fused, v1, g1 = minkunet_graph(np.random.default_rng(3), True)
    ops, v2, g2 = minkunet_graph(np.random.default_rng(3), False)
    with capsys.disabled():
        print(f"\nMinkUNet 0.5x fp16 step graph: {sum(fused.values())} primitives with the CUDA norms, "
              f"{sum(ops.values())} with the MLX-op norms; CUDA norms: {dict(fused.most_common(8))}")
    assert sum(fused.values()) < 0.8 * sum(ops.values())
    np.testing.assert_allclose(to_np(v1), to_np(v2), rtol=2e-2)
    assert len(tree_flatten(g1)) == len(tree_flatten(g2))


@pytest.mark.cuda
@needs_cuda
@pytest.mark.usefixtures("on_gpu")
@pytest.mark.parametrize("c", [1, 33, 300])
def test_running_statistics_kernel(rng, c):
    """The running-statistics kernel gives the bits of the MLX-op
    expressions (float32, no contraction), and a BatchNorm training call
    puts it into the graph in place of those expressions."""
    rm, rv = (mx.array(rng.standard_normal(c).astype(np.float32)) for _ in range(2))
    bm = mx.array(rng.standard_normal((1, c)).astype(np.float32))
    bv = mx.array(rng.random((1, c)).astype(np.float32) * 3)
    n, mu = 4097, 0.1
    got = cuda_norm.running_stats(rm, rv, bm, bv, 1 - mu, mu, n / (n - 1))
    want = ((1 - mu) * rm + mu * bm[0], (1 - mu) * rv + mu * (bv[0] * (n / (n - 1))))
    for g, w in zip(got, want):
        assert g.shape == (c,) and g.dtype == mx.float32
        assert to_np(g).tobytes() == to_np(w).tobytes()
    bn = nn.BatchNorm(c)
    xs = sparse(features(rng, 500, c, mx.float32), np.zeros(500, np.int32))
    nn.norm_act(bn, xs, nn.ReLU())
    nodes = graph_nodes(bn.running_mean, bn.running_var)
    assert "Gather" not in nodes and "Multiply" not in nodes and "Add" not in nodes, nodes


@pytest.mark.cuda
@needs_cuda
@pytest.mark.usefixtures("on_gpu")
@pytest.mark.parametrize("c,residual", [(1, False), (33, True), (300, False)])
def test_running_statistics_from_the_merge_kernel(rng, c, residual):
    """A BatchNorm training call forms its running statistics in the
    statistics' merge kernel: the bits running_stats gives on the same
    call's batch statistics, y as norm_act_layer gives it, and no kernel of
    their own in the graph."""
    n, mu = 700, 0.1
    x = features(rng, n, c, mx.float32, offset=5.0)
    r = features(rng, n, c, mx.float32) if residual else None
    bn = nn.BatchNorm(c, momentum=mu)
    bn.running_mean = mx.array(rng.standard_normal(c).astype(np.float32))
    bn.running_var = mx.array(rng.random(c).astype(np.float32) + 0.5)
    rm, rv = bn.running_mean, bn.running_var
    y = nn.norm_act(bn, sparse(x, np.zeros(n, np.int32)), nn.ReLU(),
                    residual=None if r is None else sparse(r, np.zeros(n, np.int32)))
    nodes = graph_nodes(bn.running_mean, bn.running_var)
    kernels = sum(v for k, v in nodes.items() if "Custom" in k)
    assert kernels == 2, nodes  # the statistics and their merge
    y_ref, mean, var = cuda_norm.norm_act_layer(x, bn.weight, bn.bias, r, None, 1, None, None, bn.eps, 1, 0.0)
    want = cuda_norm.running_stats(rm, rv, mean, var, 1 - mu, mu, n / (n - 1))
    assert to_np(y.feats).tobytes() == to_np(y_ref).tobytes()
    for got, w in zip((bn.running_mean, bn.running_var), want):
        assert got.shape == (c,) and got.dtype == mx.float32
        assert to_np(got).tobytes() == to_np(w).tobytes()
    with pytest.raises(ValueError, match="running_var must be float32 of shape"):
        cuda_norm.norm_act_running(x, bn.weight, bn.bias, None, bn.eps, 1, 0.0, rm, rv[:-1], 0.9, 0.1, 1.0)


def test_running_statistics_arguments():
    """Checked before any kernel runs (so on every machine)."""
    f, h = mx.zeros((4,)), mx.zeros((4,), mx.float16)
    with pytest.raises(ValueError, match="batch_var must be float32"):
        cuda_norm.running_stats(f, f, f, h, 0.9, 0.1, 1.0)
    with pytest.raises(ValueError, match="batch_mean must hold 4 values"):
        cuda_norm.running_stats(f, f, mx.zeros((1, 5)), f, 0.9, 0.1, 1.0)


def test_bad_arguments():
    """Checked before any kernel runs (so on every machine)."""
    f, w = mx.zeros((10, 3)), mx.ones((3,))
    with pytest.raises(ValueError, match="weight must have shape"):
        cuda_norm.norm_act(f, mx.ones((2,)), w, None, None, 1, None, None, EPS, 1, 0.0)
    with pytest.raises(ValueError, match="slope must be >= 0"):
        cuda_norm.norm_act(f, w, w, None, None, 1, None, None, EPS, 2, -0.5)
    with pytest.raises(ValueError, match="n_segments > 1 needs segment ids"):
        cuda_norm.norm_act(f, w, w, None, None, 2, None, None, EPS, 1, 0.0)
    with pytest.raises(ValueError, match="residual must match"):
        cuda_norm.norm_act(f, w, w, mx.zeros((10, 4)), None, 1, None, None, EPS, 1, 0.0)
    with pytest.raises(ValueError, match="both mean and var"):
        cuda_norm.norm_act(f, w, w, None, None, 1, w, None, EPS, 1, 0.0)
    with pytest.raises(ValueError, match="eps must be positive"):
        cuda_norm.norm_act(f, w, w, None, None, 1, None, None, 0.0, 1, 0.0)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        cuda_norm.norm_act(f.astype(mx.int32), w, w, None, None, 1, None, None, EPS, 1, 0.0)
    with pytest.raises(ValueError, match="segments must have shape"):
        cuda_norm.norm_act(f, w, w, None, mx.zeros((3,), mx.int32), 2, None, None, EPS, 1, 0.0)
