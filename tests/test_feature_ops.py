"""The CPU primitives between layers: fork (a tensor shared by two layers,
whose backward pass sums both cotangents) and the channel concatenation of
``algebra.cat``. Both must give MLX's own bits (``a + b``, ``concatenate``)
for every layout, dtype and thread count, and the MinkUNet built on them
the same gradients as without them."""

import collections
import re

import numpy as np
import pytest
import mlx.core as mx
import mlx.nn as mnn
from mlx.utils import tree_flatten

import mlx_lattice
from mlx_lattice import SparseTensor, _ext, algebra
from mlx_lattice.models import MinkUNet

pytestmark = pytest.mark.usefixtures("on_cpu")

DTYPES = [mx.float32, mx.float16, mx.bfloat16]


def bits(a):
    return np.array(a.astype(mx.float32)).tobytes() if a.dtype != mx.float32 else np.array(a).tobytes()


def layouts(rng, n, c, dtype):
    """(N, C) arrays of one shape in several layouts: dense, a column slice
    of a wider array (row-strided), a transpose and a row broadcast."""
    dense = mx.array(rng.standard_normal((n, c)).astype(np.float32)).astype(dtype)
    wide = mx.array(rng.standard_normal((n, c + 7)).astype(np.float32)).astype(dtype)[:, 3 : 3 + c]
    trans = mx.array(rng.standard_normal((c, n)).astype(np.float32)).astype(dtype).T
    bcast = mx.broadcast_to(mx.array(rng.standard_normal((1, c)).astype(np.float32)).astype(dtype), (n, c))
    return {"dense": dense, "slice": wide, "transpose": trans, "broadcast": bcast}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,c", [(0, 5), (1, 1), (257, 3), (3001, 48)])
def test_cotangent_sum_is_mlx_add(rng, dtype, n, c):
    xs = layouts(rng, n, c, dtype)
    for ka, a in xs.items():
        for kb, b in xs.items():
            got = _ext.cotangent_sum(a, b)
            assert got.shape == (n, c) and got.dtype == dtype
            assert bits(got) == bits(a + b), (ka, kb)


def test_cotangent_sum_in_place_and_threads(rng):
    # A temporary operand is donated (written over); the result is the same
    # bits for 1 and 2 threads.
    a = rng.standard_normal((5000, 37)).astype(np.float32)
    b = rng.standard_normal((5000, 37)).astype(np.float32)
    want = (a + b).tobytes()
    previous = mlx_lattice.num_threads()
    try:
        for t in (1, 2, 3):
            mlx_lattice.set_num_threads(t)
            got = _ext.cotangent_sum(mx.array(a) * 1.0, mx.array(b))
            assert np.array(got).tobytes() == want
    finally:
        mlx_lattice.set_num_threads(previous)


def test_cotangent_sum_bad_arguments():
    with pytest.raises(ValueError, match="shape"):
        _ext.cotangent_sum(mx.zeros((3, 4)), mx.zeros((3, 5)))
    with pytest.raises(ValueError, match="dtype"):
        _ext.cotangent_sum(mx.zeros((3, 4)), mx.zeros((3, 4), dtype=mx.float16))
    with pytest.raises(ValueError, match="float32"):
        _ext.cotangent_sum(mx.zeros((3, 4), dtype=mx.int32), mx.zeros((3, 4), dtype=mx.int32))
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        _ext.cotangent_sum(mx.zeros((3,)), mx.zeros((3,)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fork_values_and_gradient(rng, dtype):
    x = mx.array(rng.standard_normal((700, 13)).astype(np.float32)).astype(dtype)
    w = mx.array(rng.standard_normal((13, 13)).astype(np.float32)).astype(dtype)

    def shared(x, split):
        a, b = algebra.fork(x) if split else (x, x)
        return ((a @ w) * 3 + mx.sin(b)).astype(mx.float32).sum()

    a, b = algebra.fork(x)
    assert bits(a) == bits(x) and bits(b) == bits(x)
    g_fork = mx.grad(lambda x: shared(x, True))(x)
    g_plain = mx.grad(lambda x: shared(x, False))(x)
    assert bits(g_fork) == bits(g_plain)
    # forward mode: both outputs carry the tangent
    t = mx.ones_like(x)
    _, (ta, tb) = mx.jvp(lambda x: tuple(_ext.fork(x)), [x], [t])
    assert bits(ta) == bits(t) and bits(tb) == bits(t)


def test_fork_sparse_tensor_and_passthrough(rng):
    coords = np.zeros((50, 4), np.int32)
    coords[:, 1] = np.arange(50)
    x = SparseTensor(coords, mx.array(rng.standard_normal((50, 6)).astype(np.float32)))
    a, b = algebra.fork(x)
    assert a.coordinate_set is x.coordinate_set and b.coordinate_set is x.coordinate_set
    assert bits(a.feats) == bits(x.feats)
    # float64 has no primitive: returned as is
    d = mx.zeros((4, 3), dtype=mx.float64) if hasattr(mx, "float64") else None
    if d is not None:
        p, q = algebra.fork(d)
        assert p is d and q is d
    with pytest.raises(TypeError, match="fork: x must be"):
        algebra.fork(np.zeros((3, 2), np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 4099])
def test_concat_columns_is_mlx_concatenate(rng, dtype, n):
    xs = layouts(rng, n, 5, dtype)
    parts = [xs["dense"], xs["slice"], xs["transpose"], xs["broadcast"], xs["dense"][:, :1]]
    got = _ext.concat_columns(parts)
    assert bits(got) == bits(mx.concatenate(parts, axis=1))
    ct = mx.array(rng.standard_normal((n, 21)).astype(np.float32)).astype(dtype)
    _, grads = mx.vjp(lambda *p: _ext.concat_columns(list(p)), parts, [ct])
    _, want = mx.vjp(lambda *p: mx.concatenate(p, axis=1), parts, [ct])
    for g, w in zip(grads, want):
        assert bits(g) == bits(w)
    tans = [mx.ones_like(p) for p in parts]
    _, (tj,) = mx.jvp(lambda *p: _ext.concat_columns(list(p)), parts, tans)
    assert bits(tj) == bits(mx.concatenate(tans, axis=1))


def test_concat_columns_bad_arguments():
    with pytest.raises(ValueError, match="row count"):
        _ext.concat_columns([mx.zeros((3, 4)), mx.zeros((2, 4))])
    with pytest.raises(ValueError, match="at least one"):
        _ext.concat_columns([])
    with pytest.raises(ValueError, match="float32"):
        _ext.concat_columns([mx.zeros((3, 4), dtype=mx.int32)])


def _graph_counts(outputs, path):
    mx.export_to_dot(str(path), *outputs)
    return collections.Counter(re.findall(r'label ="?([A-Za-z]+)', path.read_text()))


def test_minkunet_gradients_and_graph(rng, tmp_path, monkeypatch):
    # The MinkUNet with fork and the concatenation primitive against the same
    # model wired through MLX's Add / Concatenate: same loss and gradient bits,
    # and the graph holds 20 fewer Adds (16 residual blocks, 4 skips).
    coords = np.unique(rng.integers(0, 24, (1500, 3)), axis=0)
    coords = np.concatenate([np.zeros((len(coords), 1), np.int64), coords], 1).astype(np.int32)
    feats = mx.array(rng.standard_normal((len(coords), 4)).astype(np.float32))

    def run(tag):
        mx.random.seed(0)
        model = MinkUNet(4, 3, width=0.25)
        f = mnn.value_and_grad(model, lambda m, x: (m(x).feats ** 2).mean())
        loss, grads = f(model, SparseTensor(coords, feats))
        flat = [g for _, g in tree_flatten(grads)]
        counts = _graph_counts(flat, tmp_path / f"{tag}.dot")
        mx.eval(loss, flat)
        return loss, flat, counts

    l1, g1, c1 = run("ours")
    monkeypatch.setattr(algebra, "fork", lambda x: (x, x))
    monkeypatch.setattr(algebra, "_concat_columns", lambda p: mx.concatenate(p, axis=1))
    l0, g0, c0 = run("mlx")
    assert bits(l1) == bits(l0)
    assert len(g1) == len(g0)
    for a, b in zip(g1, g0):
        assert bits(a) == bits(b)
    assert c1["SparseFork"] == 20 and c1["SparseCotangentSum"] == 20
    assert c0["Add"] - c1["Add"] == 20
    assert c1["SparseConcatColumns"] == 4 and c1["Concatenate"] == 0
