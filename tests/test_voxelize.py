"""Points <-> voxels against brute-force references, with gradients."""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import ops, pooling
from mlx_lattice.points import devoxelize, sparse_quantize, voxelize

import oracle
from conftest import to_np


def cloud(rng, n=300, extent=2.0, batches=1, c=3):
    pts = (rng.random((n, 3)) * 2 - 1) * extent
    # some points exactly on voxel faces
    pts[: n // 10] = np.round(pts[: n // 10] * 4) / 4
    batch = rng.integers(0, batches, n)
    feats = rng.standard_normal((n, c)).astype(np.float32)
    return pts.astype(np.float32), batch, feats


@pytest.mark.parametrize("voxel_size", [0.25, (0.5, 0.25, 0.3)])
def test_sparse_quantize(rng, voxel_size):
    pts, batch, _ = cloud(rng, batches=3)
    coords, index, inverse = sparse_quantize(pts, voxel_size, batch=batch, return_index=True, return_inverse=True)
    p64 = pts.astype(np.float64)
    expected = sorted({(int(b),) + oracle.voxel_of(p, voxel_size) for p, b in zip(p64, batch)})
    assert coords.dtype == np.int32
    assert [tuple(r) for r in coords.tolist()] == expected
    for j, i in enumerate(index):
        assert (int(batch[i]),) + oracle.voxel_of(p64[i], voxel_size) == expected[j]
        members = [k for k in range(len(pts)) if (int(batch[k]),) + oracle.voxel_of(p64[k], voxel_size) == expected[j]]
        assert i == min(members)  # the first point of the voxel
    assert np.array_equal(coords[inverse, 0], batch)
    np.testing.assert_array_equal(coords[inverse][:, 1:], np.floor(p64 / np.broadcast_to(voxel_size, 3)).astype(int))
    # plain call returns just the coordinates
    assert np.array_equal(sparse_quantize(pts, voxel_size, batch=batch), coords)


@pytest.mark.parametrize("reduce", ["mean", "sum", "max"])
def test_voxelize_values_and_grad(rng, reduce):
    pts, batch, feats = cloud(rng, n=250, batches=2)
    if reduce == "max":
        feats = rng.integers(-2, 3, feats.shape).astype(np.float32)  # ties
    x, p2v = voxelize(pts, mx.array(feats), 0.5, batch=batch, reduce=reduce)
    coords, expected, ref_p2v, winners = oracle.voxelize_points(pts, feats, 0.5, batch, reduce)
    assert np.array_equal(np.array(x.coords), coords)
    np.testing.assert_array_equal(np.array(p2v), ref_p2v)
    np.testing.assert_allclose(to_np(x.feats), expected, rtol=1e-5, atol=1e-5)
    assert x.stride == (1, 1, 1)

    ct = rng.standard_normal(expected.shape)
    _, (df,) = mx.vjp(lambda f: voxelize(pts, f, 0.5, batch=batch, reduce=reduce)[0].feats,
                      [mx.array(feats)], [mx.array(ct.astype(np.float32))])
    grad = np.zeros(feats.shape)
    counts = np.bincount(ref_p2v, minlength=len(coords))
    for i, v in enumerate(ref_p2v):
        if reduce == "sum":
            grad[i] = ct[v]
        elif reduce == "mean":
            grad[i] = ct[v] / counts[v]
    if reduce == "max":
        for v in range(len(coords)):
            for ch in range(feats.shape[1]):
                grad[winners[v, ch], ch] += ct[v, ch]
    np.testing.assert_allclose(to_np(df), grad, rtol=1e-5, atol=1e-5)


def test_voxelize_jvp(rng):
    pts, batch, feats = cloud(rng)
    t = rng.standard_normal(feats.shape).astype(np.float32)
    (y,), (ty,) = mx.jvp(lambda f: voxelize(pts, f, 0.5)[0].feats, [mx.array(feats)], [mx.array(t)])
    _, expected, _, _ = oracle.voxelize_points(pts, t, 0.5)
    np.testing.assert_allclose(to_np(ty), expected, rtol=1e-5, atol=1e-5)


def test_voxelize_half_and_errors(rng):
    pts, _, feats = cloud(rng)
    x, _ = voxelize(pts, mx.array(feats).astype(mx.float16), 0.5)
    assert x.feats.dtype == mx.float16
    with pytest.raises(ValueError):
        voxelize(pts, mx.array(feats), 0.5, reduce="median")
    with pytest.raises(ValueError):
        voxelize(pts, mx.array(feats), -1.0)
    with pytest.raises(ValueError):
        voxelize(pts * 1e6, mx.array(feats), 1e-3)  # coordinates out of range
    with pytest.raises(ValueError):
        voxelize(pts, mx.array(feats[:-1]), 0.5)  # rows do not match


@pytest.mark.parametrize("mode", ["nearest", "trilinear"])
@pytest.mark.parametrize("pooled", [False, True])
def test_devoxelize_values_and_grad(rng, mode, pooled):
    pts, batch, feats = cloud(rng, n=300, batches=2)
    x, _ = voxelize(pts, mx.array(feats), 0.25, batch=batch)
    if pooled:  # a stride-2 tensor: cells twice as wide
        x = pooling.avg_pool3d(x, 2)
    queries = (rng.random((120, 3)) * 2 - 1) * 2.2  # some fall outside every voxel
    qb = rng.integers(0, 2, 120)
    y = devoxelize(x, queries, 0.25, batch=qb, mode=mode)
    w = oracle.devoxelize_weights(np.array(x.coords), x.stride, queries, 0.25, qb, mode)
    vf = to_np(x.feats)
    np.testing.assert_allclose(to_np(y), w @ vf, rtol=1e-5, atol=1e-5)
    ct = rng.standard_normal((120, vf.shape[1]))
    _, (dv,) = mx.vjp(lambda f: devoxelize(x.replace(f), queries, 0.25, batch=qb, mode=mode),
                      [x.feats], [mx.array(ct.astype(np.float32))])
    np.testing.assert_allclose(to_np(dv), w.T @ ct, rtol=1e-5, atol=1e-5)


def test_devoxelize_at_voxel_points(rng):
    pts, _, feats = cloud(rng, n=400)
    x, p2v = voxelize(pts, mx.array(feats), 0.5)
    np.testing.assert_array_equal(np.array(devoxelize(x, pts, 0.5)), np.array(x.feats[p2v]))


def test_trilinear_reproduces_linear_fields(rng):
    """On a fully occupied block, interpolating a linear function of the voxel
    centres gives that function at the query points (inside the block)."""
    g = np.stack(np.meshgrid(*(np.arange(-3, 4),) * 3, indexing="ij"), -1).reshape(-1, 3)
    coords = np.concatenate([np.zeros((len(g), 1), int), g], 1).astype(np.int32)
    vs = np.array([0.5, 0.4, 0.3])
    centres = (g + 0.5) * vs
    a, b0 = np.array([1.5, -2.0, 0.7]), 0.3
    x = ml.SparseTensor(coords, mx.array((centres @ a + b0)[:, None].astype(np.float32)))
    q = (rng.random((200, 3)) * 6 - 2.5) * vs  # between the outermost centres
    y = devoxelize(x, q, vs, mode="trilinear")
    np.testing.assert_allclose(to_np(y)[:, 0], q @ a + b0, rtol=1e-4, atol=1e-4)


def test_reexports():
    assert ops.voxelize is voxelize and ml.devoxelize is devoxelize and ml.sparse_quantize is sparse_quantize
