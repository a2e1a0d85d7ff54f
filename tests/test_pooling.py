"""Local and global pooling against dense NumPy references, with gradients."""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import ops, pooling

import oracle
from conftest import TOLERANCES, to_np

GEOMETRIES = [
    # kernel, stride, padding, dilation
    (2, None, 0, 1),
    (3, 2, 1, 1),
    (3, 1, 1, 1),
    ((2, 3, 1), (2, 1, 1), (0, 1, 0), 1),
    (3, 2, 0, 2),
]
POOLS = {
    "max": pooling.max_pool3d,
    "avg": pooling.avg_pool3d,
    "sum": pooling.sum_pool3d,
}


def make(rng, n=70, extent=7, batches=2, c=4, dtype=mx.float32, integer=False):
    coords = oracle.random_coords(rng, n, extent, batches)
    if integer:  # many exact ties
        feats = rng.integers(-2, 3, (len(coords), c)).astype(np.float32)
    else:
        feats = rng.standard_normal((len(coords), c)).astype(np.float32)
    return ml.SparseTensor(coords, mx.array(feats).astype(dtype)), coords, feats


def _stride(ks, stride):
    return ks if stride is None else stride


@pytest.mark.parametrize("reduce", sorted(POOLS))
@pytest.mark.parametrize("ks,stride,padding,dilation", GEOMETRIES)
def test_local_pool_values_and_support(rng, reduce, ks, stride, padding, dilation):
    x, coords, feats = make(rng)
    y = POOLS[reduce](x, ks, stride, padding, dilation)
    st = _stride(ks, stride)
    support = oracle.forward_support(coords, ks, st, padding, dilation)
    assert np.array_equal(np.array(y.coords), support)  # sorted, as conv3d
    expected = oracle.dense_pool(coords, feats, support, ks, st, padding, dilation, reduce)
    np.testing.assert_allclose(to_np(y.feats), expected, rtol=1e-5, atol=1e-5)
    assert y.stride == tuple(np.broadcast_to(st, 3))
    # the same coordinate rule and the same cached map as conv3d
    kshape = (ks,) * 3 if isinstance(ks, int) else ks
    w = mx.zeros((1, *kshape, x.feats.shape[1]))
    z = ops.conv3d(x, w, stride=st, padding=padding, dilation=dilation)
    assert z.coordinate_set is y.coordinate_set


@pytest.mark.parametrize("reduce", sorted(POOLS))
@pytest.mark.parametrize("ks,stride,padding,dilation", GEOMETRIES[:3])
def test_local_pool_vjp(rng, reduce, ks, stride, padding, dilation):
    x, coords, feats = make(rng, integer=(reduce == "max"))
    st = _stride(ks, stride)
    support = oracle.forward_support(coords, ks, st, padding, dilation)
    ct = rng.standard_normal((len(support), feats.shape[1])).astype(np.float32)

    def f(v):
        return POOLS[reduce](x.replace(v), ks, stride, padding, dilation).feats

    _, (dx,) = mx.vjp(f, [x.feats], [mx.array(ct)])
    if reduce == "max":
        expected = oracle.max_pool_grad(coords, feats, support, ks, st, padding, dilation, ct)
    else:
        # linear: the transpose of the dense pooling applied to the cotangent
        eye = np.eye(len(coords))
        m = oracle.dense_pool(coords, eye, support, ks, st, padding, dilation, reduce)  # (N_out, N_in)
        expected = m.T @ ct.astype(np.float64)
    np.testing.assert_allclose(to_np(dx), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduce", sorted(POOLS))
def test_local_pool_jvp(rng, reduce):
    x, coords, feats = make(rng)
    t = rng.standard_normal(feats.shape).astype(np.float32)

    def f(v):
        return POOLS[reduce](x.replace(v), 3, 2, 1).feats

    (y,), (ty,) = mx.jvp(f, [x.feats], [mx.array(t)])
    support = oracle.forward_support(coords, 3, 2, 1)
    # <ct, J t> == <J^T ct, t> with the oracle's J^T, for random cotangents
    for _ in range(3):
        ct = rng.standard_normal((len(support), feats.shape[1]))
        if reduce == "max":
            jt_ct = oracle.max_pool_grad(coords, feats, support, 3, 2, 1, 1, ct)
        else:
            m = oracle.dense_pool(coords, np.eye(len(coords)), support, 3, 2, 1, 1, reduce)
            jt_ct = m.T @ ct
        np.testing.assert_allclose((to_np(ty) * ct).sum(), (jt_ct * t).sum(), rtol=1e-4, atol=1e-4)
    if reduce != "max":  # linear: the JVP is the op applied to the tangent
        np.testing.assert_allclose(to_np(ty), to_np(f(mx.array(t))), rtol=1e-5, atol=1e-5)


def test_max_pool_ties_deterministic(rng):
    """All-equal inputs: each output's gradient goes to the first kernel offset."""
    coords = oracle.random_coords(rng, 80, 6, 1)
    x = ml.SparseTensor(coords, mx.ones((len(coords), 3)))
    support = oracle.forward_support(coords, 2, 2, 0)
    g = mx.grad(lambda v: pooling.max_pool3d(x.replace(v), 2).feats.sum())(x.feats)
    expected = oracle.max_pool_grad(coords, np.ones((len(coords), 3)), support, 2, 2, 0, 1, np.ones((len(support), 3)))
    np.testing.assert_array_equal(to_np(g), expected)
    # the winner is the lowest (dx, dy, dz) offset present in each 2x2x2 cell
    assert expected.sum() == len(support) * 3
    again = mx.grad(lambda v: pooling.max_pool3d(x.replace(v), 2).feats.sum())(x.feats)
    np.testing.assert_array_equal(np.array(again), np.array(g))


def test_avg_pool_count_empty(rng):
    x, coords, feats = make(rng)
    y = pooling.avg_pool3d(x, 3, 2, 1, count_empty=True)
    support = oracle.forward_support(coords, 3, 2, 1)
    expected = oracle.dense_pool(coords, feats, support, 3, 2, 1, 1, "avg", count_empty=True)
    np.testing.assert_allclose(to_np(y.feats), expected, rtol=1e-5, atol=1e-5)


def test_pool_half_precision(rng):
    x, coords, feats = make(rng, dtype=mx.float16)
    f16 = to_np(x.feats)
    for reduce, fn in POOLS.items():
        y = fn(x, 2)
        assert y.feats.dtype == mx.float16
        support = oracle.forward_support(coords, 2, 2)
        expected = oracle.dense_pool(coords, f16, support, 2, 2, 0, 1, reduce)
        np.testing.assert_allclose(to_np(y.feats), expected, **TOLERANCES[mx.float16])


def test_identity_pool_and_unpool(rng):
    x, coords, feats = make(rng)
    assert pooling.max_pool3d(x, 1) is x
    y = pooling.avg_pool3d(x, 2)
    # a transposed convolution with the pooling stride lands back on x's voxels
    up = ops.conv_transpose3d(y, mx.ones((4, 2, 2, 2, 4)), stride=2)
    assert up.coordinate_set is x.coordinate_set


def test_empty_input():
    x = ml.SparseTensor(np.zeros((0, 4), np.int32), mx.zeros((0, 3)))
    for fn in POOLS.values():
        assert len(fn(x, 2)) == 0
    assert pooling.global_max_pool(x).shape == (0, 3)


@pytest.mark.parametrize("reduce", ["sum", "avg", "max"])
def test_global_pool(rng, reduce):
    coords = oracle.random_coords(rng, 60, 5, 4)
    coords = coords[coords[:, 0] != 2]  # batch item 2 is empty
    coords = coords[rng.permutation(len(coords))]  # rows in any order
    feats = rng.integers(-3, 4, (len(coords), 5)).astype(np.float32)  # ties
    x = ml.SparseTensor(coords, mx.array(feats))
    fn = {"sum": pooling.global_sum_pool, "avg": pooling.global_avg_pool, "max": pooling.global_max_pool}[reduce]
    y = fn(x)
    n_b = coords[:, 0].max() + 1
    assert y.shape == (n_b, 5)
    expected = np.zeros((n_b, 5))
    grad = np.zeros_like(feats, dtype=np.float64)
    ct = rng.standard_normal((n_b, 5))
    for b in range(n_b):
        rows = np.flatnonzero(coords[:, 0] == b)
        if len(rows) == 0:
            continue
        if reduce == "sum":
            expected[b] = feats[rows].sum(0)
            grad[rows] += ct[b]
        elif reduce == "avg":
            expected[b] = feats[rows].mean(0)
            grad[rows] += ct[b] / len(rows)
        else:
            expected[b] = feats[rows].max(0)
            for ch in range(5):
                first = rows[np.flatnonzero(feats[rows, ch] == expected[b, ch]).min()]
                grad[first, ch] += ct[b, ch]
    np.testing.assert_allclose(to_np(y), expected, rtol=1e-6, atol=1e-6)
    _, (dx,) = mx.vjp(lambda v: fn(x.replace(v)), [x.feats], [mx.array(ct.astype(np.float32))])
    np.testing.assert_allclose(to_np(dx), grad, rtol=1e-5, atol=1e-5)


def test_pool_compile(rng):
    x, coords, feats = make(rng)

    def f(v):
        t = x.replace(v)
        return pooling.max_pool3d(t, 2).feats.sum() + pooling.global_avg_pool(pooling.avg_pool3d(t, 3, 2, 1)).sum()

    g_eager = mx.grad(f)(x.feats)
    g_comp = mx.compile(mx.grad(f))(x.feats)
    np.testing.assert_allclose(np.array(g_comp), np.array(g_eager), rtol=1e-6, atol=1e-6)


def test_pool_argument_errors(rng):
    x, _, _ = make(rng)
    with pytest.raises(TypeError):
        pooling.max_pool3d(x.feats, 2)
    with pytest.raises(ValueError):
        pooling.avg_pool3d(x, 0)
    with pytest.raises(ValueError):
        pooling.sum_pool3d(x, 2, padding=-1)
