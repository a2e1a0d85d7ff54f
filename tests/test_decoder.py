"""Generative-decoder plumbing: expand, downsample, prune by logits, trilinear
upsampling and unpooling, against brute-force NumPy references."""

import itertools

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import decoder, nn as snn, ops, pooling

import oracle
from conftest import TOLERANCES, assert_same_across_threads, to_np

DTYPES = [mx.float32, mx.float16, mx.bfloat16]


def make(rng, n=40, extent=6, batches=2, c=3, dtype=mx.float32, stride=1, manager=None):
    coords = oracle.random_coords(rng, n, extent, batches)
    feats = rng.standard_normal((len(coords), c)).astype(np.float32)
    x = ml.SparseTensor(coords, mx.array(feats).astype(dtype), stride=stride, manager=manager)
    return x, coords, feats


def empty(c=3, stride=1):
    return ml.SparseTensor(np.zeros((0, 4), np.int32), np.zeros((0, c), np.float32), stride=stride)


def rows(x):
    return [tuple(map(int, r)) for r in np.array(x.coords)]


# ------------------------------------------------------------------ expand
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s", [2, (1, 2, 3)])
def test_expand(rng, dtype, s):
    st = oracle._t3(s)
    x, coords, feats = make(rng, dtype=dtype, stride=6)
    y = decoder.expand(x, s)
    expected = {}
    for c, f in zip(coords.tolist(), feats):
        for d in itertools.product(*(range(v) for v in st)):
            expected[(c[0],) + tuple(st[a] * c[a + 1] + d[a] for a in range(3))] = f
    assert rows(y) == sorted(expected)  # sorted by (batch, x, y, z)
    ref = np.array([expected[r] for r in rows(y)])
    np.testing.assert_allclose(to_np(y.feats), to_np(mx.array(ref).astype(dtype)), rtol=0, atol=0)
    assert y.stride == tuple(6 // v for v in st) and y.dtype == dtype
    # the set a generative transposed convolution with kernel == stride produces
    w = mx.zeros((2, *st, 3), dtype=dtype)
    assert ops.generative_conv_transpose3d(x, w, stride=s).coordinate_set is y.coordinate_set


def test_expand_gradient_and_identity(rng):
    x, coords, feats = make(rng)
    y = decoder.expand(x, 2)
    ct = rng.standard_normal(y.feats.shape).astype(np.float32)
    _, (g,) = mx.vjp(lambda f: decoder.expand(x.replace(f), 2).feats, [x.feats], [mx.array(ct)])
    parent = {r: i for i, r in enumerate(map(tuple, coords.tolist()))}
    ref = np.zeros_like(feats)
    for j, r in enumerate(rows(y)):
        ref[parent[(r[0],) + tuple(v // 2 for v in r[1:])]] += ct[j]
    np.testing.assert_allclose(np.array(g), ref, rtol=1e-5, atol=1e-5)
    assert decoder.expand(x, 1) is x
    e = decoder.expand(empty(), 2)
    assert len(e) == 0 and e.feats.shape == (0, 3)
    with pytest.raises(TypeError, match="SparseTensor"):
        decoder.expand(np.zeros((3, 4)), 2)
    with pytest.raises(ValueError, match="stride"):
        decoder.expand(x, 0)


# ------------------------------------------------------------------ downsample
@pytest.mark.parametrize("reduce", ["mean", "sum", "max"])
def test_downsample(rng, reduce):
    x, coords, feats = make(rng, n=80)
    y = decoder.downsample(x, 2, reduce)
    groups = {}
    for c, f in zip(coords.tolist(), feats):
        groups.setdefault((c[0],) + tuple(v // 2 for v in c[1:]), []).append(f)  # floor division
    assert rows(y) == sorted(groups)
    fn = {"mean": np.mean, "sum": np.sum, "max": np.max}[reduce]
    ref = np.array([fn(np.array(groups[r], np.float64), axis=0) for r in rows(y)])
    np.testing.assert_allclose(to_np(y.feats), ref, rtol=1e-5, atol=1e-5)
    assert y.stride == (2, 2, 2)
    # bookkeeping: unpooling and transposed convolution land back on x
    assert pooling.pool_transpose3d(y, 2).coordinate_set is x.coordinate_set
    w = mx.zeros((1, 2, 2, 2, 3))
    assert ops.conv_transpose3d(y, w, stride=2).coordinate_set is x.coordinate_set
    assert len(decoder.downsample(empty(), 2, reduce)) == 0
    with pytest.raises(ValueError, match="reduce"):
        decoder.downsample(x, 2, "median")


# ------------------------------------------------------------------ prune
def _prune_ref(coords, logits, threshold, k):
    keep = []
    for b in sorted(set(coords[:, 0].tolist())):
        idx = [i for i in range(len(coords)) if coords[i, 0] == b]
        if threshold is not None:
            idx = [i for i in idx if logits[i] > threshold]
        if k is not None:
            idx = sorted(idx, key=lambda i: (-logits[i], i))[:k]
        keep += idx
    return sorted(keep)


@pytest.mark.parametrize("threshold,k", [(0.0, None), (0.5, None), (None, 3), (0.0, 2), (None, 0), (None, 100)])
def test_prune_by_logits(rng, threshold, k):
    x, coords, feats = make(rng, n=60, batches=3)
    logits = np.round(rng.standard_normal(len(coords)), 1).astype(np.float32)  # ties
    keep = _prune_ref(coords, logits, threshold, k)
    for given in (mx.array(logits), logits[:, None], x.replace(mx.array(logits[:, None]))):
        y = decoder.prune_by_logits(x, given, threshold, k=k)
        assert rows(y) == [tuple(coords[i].tolist()) for i in keep]
        np.testing.assert_array_equal(np.array(y.feats), feats[keep])
    # nn.Prune, and gradients to the kept rows only
    layer = snn.Prune(threshold, k)
    g = mx.grad(lambda f: layer(x.replace(f), mx.array(logits)).feats.sum())(x.feats)
    ref = np.zeros_like(feats)
    ref[keep] = 1
    np.testing.assert_array_equal(np.array(g), ref)


def test_prune_by_logits_errors_and_edges(rng):
    x, coords, _ = make(rng)
    nan = np.full(len(coords), np.nan, np.float32)
    assert len(decoder.prune_by_logits(x, nan)) == 0
    assert len(decoder.prune_by_logits(empty(), np.zeros(0, np.float32))) == 0
    with pytest.raises(ValueError, match="scores must be"):
        decoder.prune_by_logits(x, np.zeros(len(coords) + 1))
    with pytest.raises(ValueError, match="k must be"):
        decoder.prune_by_logits(x, np.zeros(len(coords)), k=-1)
    with pytest.raises(TypeError, match="threshold"):
        decoder.prune_by_logits(x, np.zeros(len(coords)), threshold="0")
    other, *_ = make(rng, n=len(coords) + 5)
    with pytest.raises(ValueError, match="coordinate set"):
        decoder.prune_by_logits(x, other.replace(mx.zeros((len(other), 1))))


@pytest.mark.parametrize("threshold,k", [(0.0, None), (0.5, 2), (None, 1), (None, None)])
@pytest.mark.parametrize("kind", ["tensor", "set", "array", "array_view", "list"])
def test_prune_by_logits_keeps_targets(rng, threshold, k, kind):
    """keep=: a voxel survives when its logits pass (threshold, top k) or it
    is a target voxel; against a NumPy oracle."""
    x, coords, feats = make(rng, n=70, batches=3)
    logits = np.round(rng.standard_normal(len(coords)), 1).astype(np.float32)
    # targets: some of x's voxels (repeated), and voxels x does not hold
    chosen = coords[rng.random(len(coords)) < 0.3]
    outside = oracle.random_coords(rng, 30, 6, 3, low=20)
    target = np.concatenate([chosen, outside, chosen[:3]])
    unique_target = np.unique(target, axis=0)
    given = {
        "tensor": ml.SparseTensor(unique_target, np.zeros((len(unique_target), 1), np.float32)),
        "set": ml.SparseTensor(unique_target, np.zeros((len(unique_target), 1), np.float32)).coordinate_set,
        "array": target,
        "array_view": mx.array(np.ascontiguousarray(target.T)).T,
        "list": target.tolist(),
    }[kind]
    passed = set(_prune_ref(coords, logits, threshold, k))
    in_target = {tuple(r) for r in target.tolist()}
    want = [i for i in range(len(coords)) if i in passed or tuple(coords[i].tolist()) in in_target]
    y = decoder.prune_by_logits(x, mx.array(logits), threshold, k=k, keep=given)
    assert rows(y) == [tuple(coords[i].tolist()) for i in want]
    np.testing.assert_array_equal(np.array(y.feats), feats[want])
    # the layer takes it too, and gradients reach the kept rows only
    layer = snn.Prune(threshold, k)
    g = mx.grad(lambda f: layer(x.replace(f), mx.array(logits), keep=given).feats.sum())(x.feats)
    ref = np.zeros_like(feats)
    ref[want] = 1
    np.testing.assert_array_equal(np.array(g), ref)


def test_prune_by_logits_keep_errors(rng):
    x, coords, _ = make(rng, n=30)
    logits = np.zeros(len(coords), np.float32)
    strided = ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32), stride=2)
    with pytest.raises(ValueError, match=r"keep has stride \(2, 2, 2\) but x has stride \(1, 1, 1\)"):
        decoder.prune_by_logits(x, logits, keep=strided)
    with pytest.raises(ValueError, match="stride"):
        decoder.prune_by_logits(x, logits, keep=strided.coordinate_set)
    with pytest.raises(TypeError, match="keep must be a SparseTensor.*integer"):
        decoder.prune_by_logits(x, logits, keep=coords.astype(np.float32))
    with pytest.raises(ValueError, match=r"prune_by_logits: keep must have shape \(N, 4\)"):
        decoder.prune_by_logits(x, logits, keep=coords[:, 1:])
    # nothing kept by the logits and an empty target: nothing kept
    assert len(decoder.prune_by_logits(x, logits, keep=np.zeros((0, 4), np.int32))) == 0
    # every voxel a target: x itself
    assert decoder.prune_by_logits(x, logits, keep=x) is x


def test_decoder_doc_training_example_runs():
    """The keep= example of docs/decoder.md, run as written."""
    from pathlib import Path
    import re

    page = (Path(__file__).resolve().parent.parent / "docs" / "decoder.md").read_text()
    section = page.split("### Training a completion decoder")[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks and all("keep=" in b for b in blocks)
    for code in blocks:
        exec(compile(code, "docs/decoder.md", "exec"), {"__name__": "docs_decoder"})


# ------------------------------------------------------------------ upsample
def upsample_ref(coarse, feats, s, fine, t):
    """Hat-function weights over every active coarse voxel, in world units
    (the finest grid, cell i centred at i + 1/2), normalised by their sum."""
    s, t = np.asarray(oracle._t3(s), float), np.asarray(oracle._t3(t), float)
    coarse, fine = np.asarray(coarse, np.int64), np.asarray(fine, np.int64)
    out = np.zeros((len(fine), feats.shape[1]))
    weights = np.zeros((len(fine), len(coarse)))
    for i, f in enumerate(fine):
        pos = t * (f[1:] + 0.5)  # target centre
        for j, c in enumerate(coarse):
            if c[0] != f[0]:
                continue
            dist = np.abs(pos - s * (c[1:] + 0.5)) / s
            weights[i, j] = np.prod(np.maximum(0.0, 1.0 - dist))
        tot = weights[i].sum()
        weights[i] = weights[i] / tot if tot > 0 else 0.0
        out[i] = weights[i] @ np.asarray(feats, np.float64)
    return out, weights


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s,t", [(2, 1), (4, 1), (4, 2), ((2, 4, 1), (1, 2, 1)), (2, 2), (3, 1)])
def test_upsample(rng, dtype, s, t):
    x, coords, feats = make(rng, n=50, extent=5, dtype=dtype, stride=s)
    # targets: strays near and far, and corners of coarse voxels
    fine = np.unique(np.concatenate([
        oracle.random_coords(rng, 120, 14, 2),
        coords[:20] * np.array([1, 2, 2, 2]),
    ]), axis=0).astype(np.int32)
    target = ml.SparseTensor(fine, np.zeros((len(fine), 1), np.float32), stride=t, manager=x.manager)
    y = decoder.upsample(x, target)
    ref, weights = upsample_ref(coords, to_np(x.feats), s, fine, t)
    assert y.coordinate_set is target.coordinate_set and y.dtype == dtype
    np.testing.assert_allclose(to_np(y.feats), ref, **TOLERANCES[dtype])
    if dtype == mx.float32:
        ct = rng.standard_normal(y.feats.shape).astype(np.float32)
        _, (g,) = mx.vjp(lambda f: decoder.upsample(x.replace(f), target).feats, [x.feats], [mx.array(ct)])
        np.testing.assert_allclose(np.array(g), weights.T @ ct, rtol=1e-4, atol=1e-4)


def test_upsample_properties(rng):
    x, coords, _ = make(rng, n=60, stride=2)
    const = x.replace(mx.full((len(x), 3), 2.5))
    fine = decoder.expand(x, 2)
    # a constant field stays constant (the weights of missing voxels are renormalised)
    np.testing.assert_allclose(np.array(decoder.upsample(const, fine).feats), 2.5, rtol=1e-6)
    # same stride: the identity on x's own voxels
    np.testing.assert_array_equal(np.array(decoder.upsample(x, x).feats), np.array(x.feats))
    # coordinates as an array with an explicit stride; from another manager
    arr = np.array(fine.coords)
    a = decoder.upsample(x, arr, stride=1)
    np.testing.assert_array_equal(np.array(a.feats), np.array(decoder.upsample(x, fine).feats))
    other = ml.SparseTensor(arr.copy(), np.zeros((len(arr), 1), np.float32))
    np.testing.assert_array_equal(np.array(snn.Upsample()(x, other).feats), np.array(a.feats))
    # far away targets get zeros; empty inputs
    far = np.array([[0, 1000, 1000, 1000]], np.int32)
    np.testing.assert_array_equal(np.array(decoder.upsample(x, far).feats), 0)
    assert decoder.upsample(x, np.zeros((0, 4), np.int32)).feats.shape == (0, 3)
    assert np.all(np.array(decoder.upsample(empty(stride=2), arr).feats) == 0)
    with pytest.raises(ValueError, match="disagrees"):
        decoder.upsample(x, fine, stride=2)
    with pytest.raises(ValueError, match="coordinates must have shape"):
        decoder.upsample(x, np.zeros((3, 3), np.int32))


# ------------------------------------------------------------------ unpooling
def unpool_ref(coarse, feats, fine, ks, s, p, dl):
    ks, s, p, dl = map(oracle._t3, (ks, s, p, dl))
    at = {tuple(r): i for i, r in enumerate(np.asarray(fine).tolist())}
    out = np.zeros((len(fine), feats.shape[1]))
    for c, f in zip(np.asarray(coarse).tolist(), np.asarray(feats, np.float64)):
        for d in oracle.offsets(ks):
            q = (c[0],) + tuple(s[a] * c[a + 1] - p[a] + dl[a] * d[a] for a in range(3))
            if q in at:
                out[at[q]] += f
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ks,st,pad,dil", [(2, None, 0, 1), (3, 2, 1, 1), ((2, 1, 3), (2, 1, 2), 0, (1, 1, 2))])
def test_pool_transpose3d(rng, dtype, ks, st, pad, dil):
    x, coords, feats = make(rng, dtype=dtype, stride=2)
    stride = ks if st is None else st
    # default support: s * p (no recorded finer set)
    y = pooling.pool_transpose3d(x, ks, st, pad, dil)
    s3 = np.asarray(oracle._t3(stride))
    assert rows(y) == [tuple(int(v) for v in r) for r in coords * np.array([1, *s3])]
    np.testing.assert_allclose(to_np(y.feats), unpool_ref(coords, to_np(x.feats), np.array(y.coords), ks, stride, pad, dil),
                               **TOLERANCES[dtype])
    # explicit coordinates
    fine = oracle.random_coords(rng, 150, 12, 2)
    y = pooling.pool_transpose3d(x, ks, st, pad, dil, coordinates=fine)
    assert np.array_equal(np.array(y.coords), fine)
    np.testing.assert_allclose(to_np(y.feats), unpool_ref(coords, to_np(x.feats), fine, ks, stride, pad, dil),
                               **TOLERANCES[dtype])
    if dtype == mx.float32:
        # the adjoint of sum pooling with the same geometry
        f = mx.array(rng.standard_normal((len(fine), 3)).astype(np.float32))
        fine_t = ml.SparseTensor(fine, f, manager=x.manager, stride=1)
        pooled = pooling.sum_pool3d(fine_t, ks, st, pad, dil)
        xs = pooling.pool_transpose3d(pooled, ks, st, pad, dil, coordinates=fine_t)
        # <unpool(z), f> == <z, pool(f)> for z = pooled feats
        lhs = float((xs.feats * f).sum())
        rhs = float((pooled.feats * pooled.feats).sum())
        assert abs(lhs - rhs) < 1e-3 * max(1.0, abs(rhs))


def test_pool_transpose3d_roundtrip_and_module(rng):
    x, coords, feats = make(rng, n=80)
    pooled = pooling.max_pool3d(x, 2)
    up = snn.PoolTranspose3d(2)(pooled)
    assert up.coordinate_set is x.coordinate_set  # lands on the encoder's voxels
    parent = {r: i for i, r in enumerate(rows(pooled))}
    ref = np.array([np.array(pooled.feats)[parent[(r[0],) + tuple(v // 2 for v in r[1:])]] for r in rows(x)])
    np.testing.assert_array_equal(np.array(up.feats), ref)
    assert len(pooling.pool_transpose3d(empty(), 2)) == 0
    with pytest.raises(TypeError, match="SparseTensor"):
        pooling.pool_transpose3d(feats, 2)


def test_nn_expand_downsample(rng):
    x, *_ = make(rng)
    e = snn.Expand(2)(x)
    d = snn.Downsample(2, "max")(e)
    np.testing.assert_array_equal(np.array(d.coords), np.array(x.coords))
    np.testing.assert_array_equal(np.array(d.feats), np.array(x.feats))
    assert "stride=(2, 2, 2)" in repr(snn.Expand(2))
    with pytest.raises(ValueError, match="reduce"):
        snn.Downsample(2, "min")


def test_decoder_step_determinism(rng):
    x, *_ = make(rng, n=200, extent=10, c=8, stride=2)

    def run():
        e = decoder.expand(x, 2)
        u = decoder.upsample(x, e)
        p = pooling.pool_transpose3d(decoder.downsample(u, 2), 2)
        return u.feats, p.feats

    assert_same_across_threads(run, (1, max(2, ml.num_threads())))


def test_forward_mode(rng):
    """JVPs equal the VJP-transposed linear maps (all these ops are linear in the features)."""
    x, *_ = make(rng, n=60, stride=2)
    fine = decoder.expand(x, 2)
    maps = [
        lambda f: decoder.expand(x.replace(f), 2).feats,
        lambda f: decoder.upsample(x.replace(f), fine).feats,
        lambda f: pooling.pool_transpose3d(x.replace(f), 3, 2, 1).feats,
        lambda f: decoder.downsample(x.replace(f), 2, "mean").feats,
    ]
    for fn in maps:
        t = mx.array(rng.standard_normal(x.feats.shape).astype(np.float32))
        _, (jt,) = mx.jvp(fn, [x.feats], [t])
        ct = mx.array(rng.standard_normal(jt.shape).astype(np.float32))
        _, (vc,) = mx.vjp(fn, [x.feats], [ct])
        # <J t, c> == <t, J^T c>
        np.testing.assert_allclose(float((jt * ct).sum()), float((t * vc).sum()), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.array(jt), np.array(fn(t)), rtol=1e-5, atol=1e-5)


def test_upsample_agrees_with_devoxelize(rng):
    """Interpolating at the target voxels' centres reads the same values."""
    x, *_ = make(rng, n=70, stride=4)
    fine = oracle.random_coords(rng, 200, 20, 2)
    y = decoder.upsample(x, fine, stride=1)
    centres = (fine[:, 1:] + 0.5).astype(np.float64)
    ref = ml.devoxelize(x, centres, 1.0, batch=fine[:, 0], mode="trilinear")
    np.testing.assert_allclose(np.array(y.feats), np.array(ref), rtol=1e-5, atol=1e-6)


def test_compile(rng):
    """The feature paths are MLX ops only, so mx.compile traces them."""
    x, *_ = make(rng, n=60, stride=2)
    fine = decoder.expand(x, 2)
    for fn in (
        lambda f: decoder.expand(x.replace(f), 2).feats,
        lambda f: decoder.upsample(x.replace(f), fine).feats,
        lambda f: pooling.pool_transpose3d(x.replace(f), 2).feats,
    ):
        np.testing.assert_array_equal(np.array(mx.compile(fn)(x.feats)), np.array(fn(x.feats)))
