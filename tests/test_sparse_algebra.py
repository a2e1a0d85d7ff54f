"""Coordinate set ops, element-wise sub/mul/maximum/minimum on different
supports, crop and top-k rows, against Python sets and dictionaries."""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import algebra, coordsets

import oracle
from conftest import TOLERANCES, to_np


def make(rng, n=50, extent=6, batches=2, c=3, dtype=mx.float32, manager=None):
    coords = oracle.random_coords(rng, n, extent, batches)
    feats = rng.standard_normal((len(coords), c)).astype(np.float32)
    return ml.SparseTensor(coords, mx.array(feats).astype(dtype), manager=manager), coords, feats


def keys(coords):
    return [tuple(map(int, r)) for r in np.asarray(coords)]


def as_dict(x):
    return dict(zip(keys(np.array(x.coords)), to_np(x.feats)))


# ------------------------------------------------------------------ sets
@pytest.mark.parametrize("kind", ["tensor", "set", "array"])
def test_lookup_contains(rng, kind):
    x, coords, _ = make(rng)
    s = {"tensor": x, "set": x.coordinate_set, "array": coords}[kind]
    queries = np.concatenate([coords[::-1], oracle.random_coords(rng, 40, 8, 3), coords[:5]])  # repeats
    at = {k: i for i, k in enumerate(keys(coords))}
    ref = np.array([at.get(k, -1) for k in keys(queries)])
    got = coordsets.lookup(s, queries)
    assert got.dtype == mx.int32
    np.testing.assert_array_equal(np.array(got), ref)
    np.testing.assert_array_equal(np.array(ml.contains(s, mx.array(queries))), ref >= 0)
    assert ml.lookup(s, np.zeros((0, 4), np.int32)).shape == (0,)
    assert np.all(np.array(ml.lookup(np.zeros((0, 4), np.int32), queries)) == -1)


@pytest.mark.parametrize("kind", ["tensor", "array"])
def test_union_intersection(rng, kind):
    a, ca, _ = make(rng)
    b, cb, _ = make(rng, manager=a.manager)
    pa, pb = (a, b) if kind == "tensor" else (ca, cb)
    in_a = set(keys(ca))
    u = ml.union(pa, pb)
    assert keys(np.array(u)) == keys(ca) + [k for k in keys(cb) if k not in in_a]
    in_b = set(keys(cb))
    assert keys(np.array(ml.intersection(pa, pb))) == [k for k in keys(ca) if k in in_b]
    e = np.zeros((0, 4), np.int32)
    assert keys(np.array(ml.union(e, pb))) == keys(cb)
    assert np.array(ml.intersection(pa, e)).shape == (0, 4)
    # the supports of add (union) and mul (intersection)
    assert np.array_equal(np.array(ml.union(a, b)), np.array(ml.add(a, b, mode="union").coords))
    assert np.array_equal(np.array(ml.intersection(a, b)), np.array(ml.mul(a, b, mode="intersection").coords))


def _layouts(c):
    """``c`` ((N, 4) int32 NumPy) in every layout the SparseTensor constructor
    takes: lists, NumPy and MLX arrays of other dtypes, transposed, sliced,
    reversed and column-picked views."""
    wide = np.concatenate([c + 7, c], axis=1)  # c in columns 4:8
    wide_mx = mx.array(wide)
    return {
        "list": c.tolist(),
        "np_int64": c.astype(np.int64),
        "np_int16": c.astype(np.int16),
        "np_fortran": np.asfortranarray(c),
        "np_transposed": np.ascontiguousarray(c.T).T,
        "np_column_slice": wide[:, 4:],
        "np_reversed": c[::-1].copy()[::-1],
        "mx_int32": mx.array(c),
        "mx_int64": mx.array(c.astype(np.int64)),
        "mx_transposed": mx.array(np.ascontiguousarray(c.T)).T,
        "mx_column_slice": wide_mx[:, 4:],
        "mx_reversed": mx.array(c[::-1].copy())[::-1],
        "mx_row_step": mx.array(np.repeat(c, 2, axis=0))[::2],
    }


LAYOUTS = sorted(_layouts(np.zeros((1, 4), np.int32)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_set_ops_take_every_constructor_layout(rng, layout):
    """Against a brute-force NumPy oracle: each argument of lookup,
    contains, union and intersection in each layout the constructor takes."""
    ca = oracle.random_coords(rng, 60, 6, 2)
    cb = oracle.random_coords(rng, 60, 6, 2)
    queries = np.concatenate([cb, ca[::3], cb[:4]])  # repeats, hits and misses
    # what the constructor makes of the layout: the same rows
    t = ml.SparseTensor(_layouts(ca)[layout], np.zeros((len(ca), 1), np.float32))
    np.testing.assert_array_equal(np.array(t.coords), ca)

    def brute_lookup(c, q):  # row of each query in c by comparing every pair
        eq = (np.asarray(q)[:, None, :] == np.asarray(c)[None, :, :]).all(axis=2)
        return np.where(eq.any(axis=1), eq.argmax(axis=1), -1)

    for coords_arg in (_layouts(ca)[layout], t, ca):
        got = ml.lookup(coords_arg, _layouts(queries)[layout])
        np.testing.assert_array_equal(np.array(got), brute_lookup(ca, queries))
        np.testing.assert_array_equal(np.array(ml.contains(coords_arg, _layouts(queries)[layout])),
                                      brute_lookup(ca, queries) >= 0)
    in_a = brute_lookup(ca, cb) >= 0
    in_b = brute_lookup(cb, ca) >= 0
    want_union = np.concatenate([ca, cb[~in_a]])
    want_inter = ca[in_b]
    for a_arg, b_arg in ((_layouts(ca)[layout], _layouts(cb)[layout]), (t, _layouts(cb)[layout]),
                         (_layouts(ca)[layout], cb)):
        np.testing.assert_array_equal(np.array(ml.union(a_arg, b_arg)), want_union)
        np.testing.assert_array_equal(np.array(ml.intersection(a_arg, b_arg)), want_inter)


def test_set_errors(rng):
    a, ca, _ = make(rng)
    b = ml.SparseTensor(ca, np.zeros((len(ca), 1), np.float32), stride=2)
    with pytest.raises(ValueError, match="strides differ"):
        ml.union(a, b)
    with pytest.raises(ValueError, match="queries must have shape"):
        ml.lookup(a, np.zeros((3, 3), np.int32))
    with pytest.raises(TypeError, match="integer dtype"):
        ml.contains(a, np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError):
        ml.lookup(np.array([[0, 1, 1, 1], [0, 1, 1, 1]]), ca)  # repeated rows


# ------------------------------------------------------------------ element-wise
REF = {
    "sub": (lambda u, v: u - v, 0.0),
    "mul": (lambda u, v: u * v, 0.0),
    "maximum": (np.maximum, None),
    "minimum": (np.minimum, None),
    "add": (lambda u, v: u + v, 0.0),
}


def binary_ref(op, ca, fa, cb, fb, mode):
    fn, absent = REF[op]
    a, b = dict(zip(keys(ca), fa)), dict(zip(keys(cb), fb))
    order = keys(ca) + [k for k in keys(cb) if k not in a] if mode == "union" else [k for k in keys(ca) if k in b]
    out = {}
    for k in order:
        if k in a and k in b:
            out[k] = fn(a[k], b[k])
        elif absent is None:
            out[k] = a[k] if k in a else b[k]
        else:
            z = np.zeros_like(a[k] if k in a else b[k])
            out[k] = fn(a.get(k, z), b.get(k, z))
    return order, np.array([out[k] for k in order]).reshape(len(order), -1)


@pytest.mark.parametrize("op", ["sub", "mul", "maximum", "minimum", "add"])
@pytest.mark.parametrize("mode", ["union", "intersection"])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_binary_ops(rng, op, mode, dtype):
    a, ca, _ = make(rng, dtype=dtype)
    b, cb, _ = make(rng, dtype=dtype)
    fa, fb = to_np(a.feats), to_np(b.feats)
    y = getattr(ml, op)(a, b, mode=mode)
    order, ref = binary_ref(op, ca, fa, cb, fb, mode)
    assert keys(np.array(y.coords)) == order and y.dtype == dtype
    np.testing.assert_allclose(to_np(y.feats), ref, **TOLERANCES[dtype])
    # same coordinate set: a's rows
    same = getattr(ml, op)(a, a.replace(b.feats[: len(a)] if len(b) >= len(a) else a.feats))
    assert same.coordinate_set is a.coordinate_set
    # subset of a: a's coordinate set is kept for the union
    sub = algebra.prune(a, np.arange(len(a)) % 2 == 0)
    y2 = getattr(ml, op)(a, sub, mode="union")
    assert y2.coordinate_set is a.coordinate_set
    order2, ref2 = binary_ref(op, ca, fa, np.array(sub.coords), to_np(sub.feats), "union")
    np.testing.assert_allclose(to_np(y2.feats), ref2, **TOLERANCES[dtype])


def test_binary_defaults_gradients_errors(rng):
    a, ca, fa = make(rng)
    b, cb, fb = make(rng)
    assert keys(np.array(ml.mul(a, b, mode="intersection").coords)) == binary_ref("mul", ca, fa, cb, fb, "intersection")[0]
    assert len(ml.sub(a, b, mode="union")) == len(ml.union(a, b))
    # gradient of maximum: to the larger operand, and to a lone operand
    ga, gb = mx.grad(lambda u, v: ml.maximum(a.replace(u), b.replace(v), mode="union").feats.sum(), argnums=(0, 1))(a.feats, b.feats)
    bd = dict(zip(keys(cb), fb))
    ref_a = np.array([[1.0 if (k not in bd or u > bd[k][j]) else 0.0 for j, u in enumerate(row)] for k, row in zip(keys(ca), fa)])
    np.testing.assert_array_equal(np.array(ga), ref_a)
    ad = dict(zip(keys(ca), fa))
    ref_b = np.array([[1.0 if (k not in ad or v > ad[k][j]) else 0.0 for j, v in enumerate(row)] for k, row in zip(keys(cb), fb)])
    np.testing.assert_array_equal(np.array(gb), ref_b)
    # gradient of sub on the union: -1 for every b row
    gb = mx.grad(lambda v: ml.sub(a, b.replace(v), mode="union").feats.sum())(b.feats)
    np.testing.assert_array_equal(np.array(gb), -1.0)
    with pytest.raises(ValueError, match="mode must be"):
        ml.mul(a, b, mode="both")
    with pytest.raises(ValueError, match="channel counts differ"):
        ml.sub(a, b.replace(mx.zeros((len(b), 2))))
    with pytest.raises(TypeError, match="dtypes differ"):
        ml.minimum(a, b.astype(mx.float16))
    with pytest.raises(TypeError, match="SparseTensor"):
        ml.maximum(a, fb)
    e = ml.SparseTensor(np.zeros((0, 4), np.int32), np.zeros((0, 3), np.float32))
    assert len(ml.mul(a, e, mode="intersection")) == 0 and len(ml.maximum(e, e)) == 0
    np.testing.assert_array_equal(np.array(ml.sub(e, a, mode="union").feats), -fa)


# ------------------------------------------------------------------ crop / top-k
def test_crop(rng):
    x, coords, feats = make(rng, n=120, extent=8, batches=3)
    lo, hi = (-2, -1, 0), (2, 3, 3)
    keep = [i for i, c in enumerate(coords.tolist()) if all(lo[a] <= c[a + 1] < hi[a] for a in range(3))]
    y = ml.crop(x, lo, hi)
    assert keys(np.array(y.coords)) == keys(coords[keep])
    np.testing.assert_array_equal(np.array(y.feats), feats[keep])
    # a box per batch item
    los = np.array([[-4, -4, -4], [0, 0, 0], [-1, -2, -3]])
    his = np.array([[4, 4, 4], [2, 2, 2], [1, 0, 3]])
    keep = [i for i, c in enumerate(coords.tolist()) if all(los[c[0], a] <= c[a + 1] < his[c[0], a] for a in range(3))]
    y = ml.crop(x, los, his)
    assert keys(np.array(y.coords)) == keys(coords[keep])
    g = mx.grad(lambda f: ml.crop(x.replace(f), los, his).feats.sum())(x.feats)
    ref = np.zeros_like(feats)
    ref[keep] = 1
    np.testing.assert_array_equal(np.array(g), ref)
    assert ml.crop(x, (-100,) * 3, (100,) * 3) is x
    assert len(ml.crop(x, (5, 5, 5), (5, 6, 6))) == 0
    e = ml.SparseTensor(np.zeros((0, 4), np.int32), np.zeros((0, 3), np.float32))
    assert len(ml.crop(e, (0, 0, 0), (1, 1, 1))) == 0
    with pytest.raises(ValueError, match="start must be"):
        ml.crop(x, (0, 0), (1, 1, 1))
    with pytest.raises(ValueError, match=r"stop must be 3 ints or a \(3, 3\)"):
        ml.crop(x, (0, 0, 0), np.ones((2, 3), int))


def test_top_k(rng):
    x, coords, feats = make(rng, n=90, batches=3, c=1)
    s = np.round(feats[:, 0], 1)  # ties
    for k in (0, 1, 4, 1000):
        keep = []
        for b in range(3):
            idx = [i for i in range(len(coords)) if coords[i, 0] == b]
            keep += sorted(idx, key=lambda i: (-s[i], i))[:k]
        keep.sort()
        y = ml.top_k(x, k, s)
        assert keys(np.array(y.coords)) == keys(coords[keep])
        np.testing.assert_array_equal(np.array(y.feats), feats[keep])
    # default scores: the tensor's one channel
    y = ml.top_k(x, 2)
    ref = []
    for b in range(3):
        idx = [i for i in range(len(coords)) if coords[i, 0] == b]
        ref += sorted(idx, key=lambda i: (-feats[i, 0], i))[:2]
    assert keys(np.array(y.coords)) == keys(coords[sorted(ref)])
    # NaN ranks last
    s2 = s.copy()
    s2[coords[:, 0] == 0] = np.nan
    s2[np.flatnonzero(coords[:, 0] == 0)[-1]] = -50.0
    y = ml.top_k(x, 1, s2)
    assert keys(np.array(y.coords))[0] == keys(coords[np.flatnonzero(coords[:, 0] == 0)[-1:]])[0]
    with pytest.raises(ValueError, match="k must be"):
        ml.top_k(x, 1.5, s)
    with pytest.raises(ValueError, match="one channel"):
        ml.top_k(x.replace(mx.zeros((len(x), 2))), 1)
