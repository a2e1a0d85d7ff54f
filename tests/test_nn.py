"""Layers of mlx_lattice.nn against NumPy references; parameters round-trip."""

import math

import numpy as np
import pytest
import mlx.core as mx
import mlx.nn as mnn
from mlx.utils import tree_flatten

import mlx_lattice as ml
from mlx_lattice import nn

import oracle
from conftest import float32_matmul_tolerance, to_np


def make(rng, n=60, extent=6, batches=2, c=4, dtype=mx.float32):
    coords = oracle.random_coords(rng, n, extent, batches)
    feats = rng.standard_normal((len(coords), c)).astype(np.float32)
    return ml.SparseTensor(coords, mx.array(feats).astype(dtype)), coords, feats


# ---------------------------------------------------------------- convolutions
def test_conv_init_like_mlx():
    mx.random.seed(3)
    for layer, ks in ((nn.Conv3d(5, 7, 3), (3, 3, 3)), (nn.SubmConv3d(5, 7, (3, 1, 3)), (3, 1, 3)),
                      (nn.ConvTranspose3d(5, 7, 2, stride=2), (2, 2, 2)),
                      (nn.GenerativeConvTranspose3d(5, 7, 2, stride=2), (2, 2, 2))):
        w = np.array(layer.weight)
        assert w.shape == (7, *ks, 5)
        bound = math.sqrt(1 / (5 * np.prod(ks)))
        assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound
        np.testing.assert_array_equal(np.array(layer.bias), np.zeros(7))
    assert "bias" not in nn.Conv3d(2, 3, 3, bias=False)
    ref = mnn.Conv3d(5, 7, 3)  # same parameter names and shapes as mlx.nn
    assert {k: v.shape for k, v in tree_flatten(ref.parameters())} == {
        k: v.shape for k, v in tree_flatten(nn.Conv3d(5, 7, 3).parameters())
    }


@pytest.mark.parametrize("kind", ["conv", "subm", "transpose", "generative"])
def test_conv_modules_against_oracle(rng, kind):
    x, coords, feats = make(rng)
    if kind == "conv":
        m = nn.Conv3d(4, 6, 3, stride=2, padding=1)
        y = m(x)
        support = oracle.forward_support(coords, 3, 2, 1)
        edges = oracle.conv_edges(coords, support, 3, 2, 1)
    elif kind == "subm":
        m = nn.SubmConv3d(4, 6, 3)
        y = m(x)
        support = coords
        edges = oracle.conv_edges(coords, coords, 3, 1, 1)
    elif kind == "transpose":
        m = nn.ConvTranspose3d(4, 6, 2, stride=2)
        y = m(x)  # no recorded parent: lands on 2 * p
        support = coords * [1, 2, 2, 2]
        edges = oracle.transposed_edges(coords, support, 2, 2)
    else:
        m = nn.GenerativeConvTranspose3d(4, 6, 2, stride=2)
        y = m(x)
        support = oracle.generative_support(coords, 2, 2)
        edges = oracle.transposed_edges(coords, support, 2, 2)
    m.bias = mx.array(rng.standard_normal(6).astype(np.float32))
    y = m(x)
    expected = oracle.apply(edges, feats, np.array(m.weight), len(support), np.array(m.bias))
    perm = oracle.match_rows(np.array(y.coords), support)
    np.testing.assert_allclose(to_np(y.feats)[perm], expected, rtol=1e-4, atol=1e-4)
    # weight gradient through the module
    ct = rng.standard_normal(expected.shape)
    ct_rows = np.zeros_like(ct)
    ct_rows[perm] = ct

    def loss(model):
        return (model(x).feats * mx.array(ct_rows.astype(np.float32))).sum()

    grads = mnn.value_and_grad(m, loss)(m)[1]
    _, dw, db = oracle.grads(edges, feats, np.array(m.weight), ct)
    np.testing.assert_allclose(np.array(grads["weight"]), dw, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.array(grads["bias"]), db, rtol=1e-4, atol=1e-4)


def test_conv_explicit_coordinates(rng):
    x, coords, feats = make(rng)
    target = coords[::3]
    m = nn.Conv3d(4, 2, 3, padding=1)
    y = m(x, coordinates=target)
    assert np.array_equal(np.array(y.coords), target)
    edges = oracle.conv_edges(coords, target, 3, 1, 1)
    expected = oracle.apply(edges, feats, np.array(m.weight), len(target), np.array(m.bias))
    np.testing.assert_allclose(to_np(y.feats), expected, rtol=1e-4, atol=1e-4)


def test_linear(rng):
    x, coords, feats = make(rng)
    lin = nn.Linear(4, 5)
    bound = 1 / math.sqrt(4)
    assert np.abs(np.array(lin.weight)).max() <= bound and np.abs(np.array(lin.bias)).max() <= bound
    y = lin(x)
    assert y.coordinate_set is x.coordinate_set
    w, b = np.array(lin.weight, np.float64), np.array(lin.bias, np.float64)
    tol = float32_matmul_tolerance()
    np.testing.assert_allclose(to_np(y.feats), feats @ w.T + b, **tol)
    dense = mx.array(feats[:3])
    np.testing.assert_allclose(np.array(lin(dense)), feats[:3] @ w.T + b, **tol)
    g = mnn.value_and_grad(lin, lambda m: m(x).feats.sum())(lin)[1]
    # TF32 rounds each summand: bound by the sum of magnitudes.
    gtol = dict(rtol=max(1e-4, tol["rtol"]), atol=max(1e-4, tol["atol"] * np.abs(feats).sum(0).max()))
    np.testing.assert_allclose(np.array(g["weight"]), np.tile(feats.sum(0), (5, 1)), **gtol)
    np.testing.assert_allclose(np.array(g["bias"]), np.full(5, len(coords)), rtol=1e-5)
    assert "bias" not in nn.Linear(3, 2, bias=False)


# ---------------------------------------------------------------- normalisation
def batch_norm_ref(x, gamma, beta, eps, ct):
    """Forward and input gradient of training-mode batch norm (float64)."""
    n = len(x)
    mu = x.mean(0)
    var = x.var(0)
    inv = 1 / np.sqrt(var + eps)
    xhat = (x - mu) * inv
    y = xhat * gamma + beta
    g = ct * gamma
    dx = inv / n * (n * g - g.sum(0) - xhat * (g * xhat).sum(0))
    return y, dx


def test_batch_norm_train_and_eval(rng):
    x, coords, feats = make(rng, c=3)
    bn = nn.BatchNorm(3, momentum=0.25)
    bn.weight = mx.array([1.0, 2.0, 0.5])
    bn.bias = mx.array([0.0, -1.0, 0.3])
    ct = rng.standard_normal(feats.shape)
    y_ref, dx_ref = batch_norm_ref(feats.astype(np.float64), np.array(bn.weight), np.array(bn.bias), 1e-5, ct)
    y = bn(x)
    np.testing.assert_allclose(to_np(y.feats), y_ref, rtol=1e-4, atol=1e-4)
    # running statistics: momentum update with the unbiased variance
    np.testing.assert_allclose(np.array(bn.running_mean), 0.25 * feats.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(bn.running_var), 0.75 + 0.25 * feats.var(0, ddof=1), rtol=1e-5)
    # input gradient
    _, (dx,) = mx.vjp(lambda f: bn(x.replace(f)).feats, [x.feats], [mx.array(ct.astype(np.float32))])
    np.testing.assert_allclose(to_np(dx), dx_ref, rtol=1e-4, atol=1e-4)
    # eval mode uses the running statistics
    bn.eval()
    rm, rv = np.array(bn.running_mean), np.array(bn.running_var)
    expected = (feats - rm) / np.sqrt(rv + 1e-5) * np.array(bn.weight) + np.array(bn.bias)
    np.testing.assert_allclose(to_np(bn(x).feats), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.array(bn.running_mean), rm)  # no update in eval
    # running stats are state, not trainable parameters
    assert "running_mean" not in dict(tree_flatten(bn.trainable_parameters()))


def test_batch_norm_small_inputs():
    bn = nn.BatchNorm(2)
    empty = ml.SparseTensor(np.zeros((0, 4), np.int32), mx.zeros((0, 2)))
    assert len(bn(empty)) == 0
    one = ml.SparseTensor(np.zeros((1, 4), np.int32), mx.array([[3.0, -1.0]]))
    np.testing.assert_allclose(np.array(bn(one).feats), [[0.0, 0.0]], atol=1e-6)
    np.testing.assert_array_equal(np.array(bn.running_var), [1.0, 1.0])


def test_instance_norm(rng):
    x, coords, feats = make(rng, batches=3, c=3)
    inorm = nn.InstanceNorm(3)
    y = to_np(inorm(x).feats)
    ct = rng.standard_normal(feats.shape)
    _, (dx,) = mx.vjp(lambda f: inorm(x.replace(f)).feats, [x.feats], [mx.array(ct.astype(np.float32))])
    for b in range(3):
        rows = coords[:, 0] == b
        y_ref, dx_ref = batch_norm_ref(feats[rows].astype(np.float64), np.ones(3), np.zeros(3), 1e-5, ct[rows])
        np.testing.assert_allclose(y[rows], y_ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(to_np(dx)[rows], dx_ref, rtol=1e-3, atol=1e-4)


def test_layer_and_rms_norm(rng):
    x, coords, feats = make(rng, c=6)
    ln = nn.LayerNorm(6)
    ln.weight = mx.array(rng.standard_normal(6).astype(np.float32))
    f = feats.astype(np.float64)
    ref = (f - f.mean(1, keepdims=True)) / np.sqrt(f.var(1, keepdims=True) + 1e-5) * np.array(ln.weight)
    np.testing.assert_allclose(to_np(ln(x).feats), ref, rtol=1e-4, atol=1e-4)
    rms = nn.RMSNorm(6)
    ref = f / np.sqrt((f**2).mean(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(to_np(rms(x).feats), ref, rtol=1e-4, atol=1e-4)
    g = mx.grad(lambda v: (rms(x.replace(v)).feats * 2).sum())(x.feats)
    r = np.sqrt((f**2).mean(1, keepdims=True) + 1e-5)
    g_ref = 2 / r - f * (2 * f).sum(1, keepdims=True) / (6 * r**3)
    np.testing.assert_allclose(to_np(g), g_ref, rtol=1e-3, atol=1e-4)


# ---------------------------------------------------------------- activations
def test_activations(rng):
    x, coords, feats = make(rng)
    f = feats.astype(np.float64)
    erf = np.vectorize(math.erf)
    cases = [
        (nn.ReLU(), np.maximum(f, 0), (f > 0).astype(float)),
        (nn.LeakyReLU(0.2), np.where(f > 0, f, 0.2 * f), np.where(f > 0, 1.0, 0.2)),
        (nn.SiLU(), f / (1 + np.exp(-f)), None),
        (nn.GELU(), 0.5 * f * (1 + erf(f / math.sqrt(2))), None),
        (nn.Sigmoid(), 1 / (1 + np.exp(-f)), None),
        (nn.Tanh(), np.tanh(f), 1 - np.tanh(f) ** 2),
    ]
    for mod, ref, dref in cases:
        y = mod(x)
        assert y.coordinate_set is x.coordinate_set
        np.testing.assert_allclose(to_np(y.feats), ref, rtol=1e-5, atol=1e-5)
        if dref is not None:
            g = mx.grad(lambda v: mod(x.replace(v)).feats.sum())(x.feats)
            np.testing.assert_allclose(to_np(g), dref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(nn.ReLU()(x.feats)), np.maximum(feats, 0))  # plain arrays too
    doubled = nn.FeatureMap(lambda v: 2 * v)(x)
    np.testing.assert_allclose(np.array(doubled.feats), 2 * feats)


def test_dropout(rng):
    coords = oracle.random_coords(rng, 400, 10, 1)
    x = ml.SparseTensor(coords, mx.ones((len(coords), 8)))
    d = nn.Dropout(0.25)
    y = np.array(d(x).feats)
    kept = y != 0
    assert 0.6 < kept.mean() < 0.9
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
    d.eval()
    np.testing.assert_array_equal(np.array(d(x).feats), np.ones((len(coords), 8)))


# ---------------------------------------------------------------- composition
def small_net():
    return nn.Sequential(
        nn.SubmConv3d(4, 8, 3), nn.BatchNorm(8), nn.ReLU(),
        nn.Conv3d(8, 16, 2, stride=2), nn.LayerNorm(16), nn.GELU(),
        nn.MaxPool3d(2), nn.ConvTranspose3d(16, 8, 2, stride=2), nn.Dropout(0.1),
        nn.Linear(8, 3),
    )


def test_sequential_save_load_round_trip(rng, tmp_path):
    x, _, _ = make(rng)
    net = small_net()
    net.train()
    net(x)  # moves the batch norm running statistics
    net.eval()
    y = np.array(net(x).feats)
    path = str(tmp_path / "net.safetensors")
    net.save_weights(path)
    other = small_net()
    other.load_weights(path)
    other.eval()
    np.testing.assert_array_equal(np.array(other(x).feats), y)
    saved = dict(tree_flatten(other.parameters()))
    assert "layers.1.running_mean" in saved
    np.testing.assert_array_equal(np.array(saved["layers.1.running_mean"]), np.array(net.layers[1].running_mean))
    npz = str(tmp_path / "net.npz")
    net.save_weights(npz)
    third = small_net()
    third.load_weights(npz)
    third.eval()
    np.testing.assert_array_equal(np.array(third(x).feats), y)


def test_pooling_modules(rng):
    x, coords, feats = make(rng)
    from mlx_lattice import pooling

    np.testing.assert_array_equal(np.array(nn.AvgPool3d(3, 2, 1)(x).feats), np.array(pooling.avg_pool3d(x, 3, 2, 1).feats))
    np.testing.assert_array_equal(np.array(nn.SumPool3d(2)(x).feats), np.array(pooling.sum_pool3d(x, 2).feats))
    np.testing.assert_array_equal(np.array(nn.GlobalMaxPool()(x)), np.array(pooling.global_max_pool(x)))
    head = nn.Sequential(nn.SubmConv3d(4, 6), nn.GlobalAvgPool(), nn.Linear(6, 2))
    assert head(x).shape == (2, 2)


def test_half_precision_modules(rng):
    x, coords, feats = make(rng, dtype=mx.float16)
    net = small_net()
    net.set_dtype(mx.float16)
    net.eval()
    y = net(x)
    assert y.feats.dtype == mx.float16 and np.isfinite(np.array(y.feats.astype(mx.float32))).all()
