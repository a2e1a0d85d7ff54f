"""cpu.row_gather: the gather-GEMM's row-major traversal for narrow inputs.

Checked against a dense NumPy reference written here, on relations built
from CSR arrays (rows without edges, rows whose offsets do not ascend, empty
relations, one row), and bit for bit against cpu.gather_gemm (the same sums
by construction), across thread counts and instruction-set paths.
"""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import _ext, ops

import oracle
from conftest import TOLERANCES, to_np

CPU = mx.default_stream(mx.cpu)
PATHS = _ext.supported_cpu_isas()
FMA_PATHS = [p for p in PATHS if p in ("avx2", "avx512")]
OUT = _ext.View.output_major


@pytest.fixture(autouse=True)
def cpu_device(on_cpu):
    yield


def relation(rng, n_in, n_out, K, max_edges=None, empty_rows=0.2, ascending=True):
    """A relation from CSR arrays: per output row a random set of distinct
    offsets (none for about `empty_rows` of the rows), each with a random
    input row; offsets ascend within a row unless `ascending` is False."""
    max_edges = K if max_edges is None else max_edges
    counts = rng.integers(1, max_edges + 1, n_out) if n_in else np.zeros(n_out, np.int64)
    counts[rng.random(n_out) < empty_rows] = 0
    ks, gather = [], []
    for c in counts:
        k = rng.choice(K, c, replace=False)
        ks.append(np.sort(k) if ascending else k)
        gather.append(rng.integers(0, n_in, c) if n_in else np.zeros(0, np.int64))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    k = np.concatenate(ks + [np.zeros(0)]).astype(np.int32)
    g = np.concatenate(gather + [np.zeros(0)]).astype(np.int32)
    rel = _ext.Relation("forward", n_in, n_out, K, mx.array(offsets), mx.array(g), mx.array(k))
    edges = [(o, int(g[e]), int(k[e])) for o in range(n_out) for e in range(offsets[o], offsets[o + 1])]
    return rel, edges


def reference(edges, x, w, n_out):
    """y[o] = sum over edges x[i] @ w[k], float64; w is (K, C_in, C_out)."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    y = np.zeros((n_out, w.shape[2]))
    for o, i, k in edges:
        y[o] += x[i] @ w[k]
    return y


def _bytes(a):
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a).tobytes()


def _conv(x, w, rel, route, view=OUT):
    y = _ext.gather_conv(x, w, rel, view, route, CPU)
    mx.eval(y)
    return y


def _inputs(rng, n_in, c_in, c_out, K, dtype):
    x = mx.array(rng.standard_normal((n_in, c_in)).astype(np.float32)).astype(dtype)
    w = mx.array((rng.standard_normal((K, c_in, c_out)) / np.sqrt(c_in * 4)).astype(np.float32)).astype(dtype)
    return x, w


@pytest.mark.parametrize("c_in,c_out,dtype", [
    (1, 1, mx.float32), (1, 16, mx.float32), (3, 3, mx.float32), (3, 17, mx.float32),
    (4, 16, mx.float32), (4, 40, mx.float32), (8, 8, mx.float32), (5, 33, mx.float32),
    (4, 16, mx.float16), (3, 20, mx.bfloat16), (20, 16, mx.float32),
])
def test_matches_reference_and_grouped_bitwise(rng, isa, c_in, c_out, dtype):
    K, n_in, n_out = 27, 300, 257
    rel, edges = relation(rng, n_in, n_out, K)
    x, w = _inputs(rng, n_in, c_in, c_out, K, dtype)
    y = _conv(x, w, rel, "cpu.row_gather")
    assert y.shape == (n_out, c_out) and y.dtype == dtype
    tol = TOLERANCES[dtype]
    np.testing.assert_allclose(to_np(y), reference(edges, to_np(x), to_np(w), n_out), **tol)
    assert _bytes(y) == _bytes(_conv(x, w, rel, "cpu.gather_gemm"))


@pytest.mark.parametrize("c_in,c_out,dtype", [(16, 16, mx.float32), (16, 32, mx.float32), (15, 9, mx.float16)])
def test_strided_shapes(rng, isa, c_in, c_out, dtype):
    # 8 offsets, one or two edges a row: the 16-channel strided layers
    K, n_in, n_out = 8, 900, 500
    rel, edges = relation(rng, n_in, n_out, K, max_edges=3, empty_rows=0.1)
    x, w = _inputs(rng, n_in, c_in, c_out, K, dtype)
    y = _conv(x, w, rel, "cpu.row_gather")
    np.testing.assert_allclose(to_np(y), reference(edges, to_np(x), to_np(w), n_out), **TOLERANCES[dtype])
    assert _bytes(y) == _bytes(_conv(x, w, rel, "cpu.gather_gemm"))


@pytest.mark.parametrize("c_in,c_out", [(4, 16), (3, 7), (2, 40)])
def test_rows_not_ascending_take_grouped_order(rng, isa, c_in, c_out):
    # offsets in random order within rows: sums still run in offset order
    K, n_in, n_out = 27, 200, 3000
    rel, edges = relation(rng, n_in, n_out, K, ascending=False)
    x, w = _inputs(rng, n_in, c_in, c_out, K, mx.float32)
    y = _conv(x, w, rel, "cpu.row_gather")
    np.testing.assert_allclose(to_np(y), reference(edges, to_np(x), to_np(w), n_out), **TOLERANCES[mx.float32])
    assert _bytes(y) == _bytes(_conv(x, w, rel, "cpu.gather_gemm"))


@pytest.mark.parametrize("n_in,n_out,empty_rows", [(0, 5, 0.0), (10, 0, 0.0), (10, 1, 0.0), (10, 40, 1.0), (10, 1, 1.0)])
def test_awkward_sizes(rng, isa, n_in, n_out, empty_rows):
    K, c_in, c_out = 8, 4, 16
    rel, edges = relation(rng, n_in, n_out, K, empty_rows=empty_rows)
    x, w = _inputs(rng, n_in, c_in, c_out, K, mx.float32)
    y = _conv(x, w, rel, "cpu.row_gather")
    assert y.shape == (n_out, c_out)
    np.testing.assert_allclose(to_np(y), reference(edges, to_np(x), to_np(w), n_out), atol=1e-6)
    if not edges:
        assert np.array_equal(to_np(y), np.zeros((n_out, c_out), np.float32))


def test_rows_with_no_edges_are_zero_not_stale(rng, isa):
    # a fresh output buffer may hold old values: rows without edges read zero
    K, c_in, c_out = 27, 4, 16
    rel, edges = relation(rng, 50, 400, K, empty_rows=0.5)
    x, w = _inputs(rng, 50, c_in, c_out, K, mx.float32)
    for _ in range(3):
        mx.eval(mx.ones((400, c_out)) * 7.0)
        y = _conv(x, w, rel, "cpu.row_gather")
        empty = [o for o in range(400) if not any(e[0] == o for e in edges)]
        assert empty and not np.any(to_np(y)[empty])


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_bitwise_across_threads(rng, isa, dtype):
    rel, _ = relation(rng, 5000, 6000, 27, max_edges=9)
    x, w = _inputs(rng, 5000, 4, 24, 27, dtype)
    ml.set_num_threads(1)
    ref = _bytes(_conv(x, w, rel, "cpu.row_gather"))
    for n in (2, 5):
        ml.set_num_threads(n)
        assert _bytes(_conv(x, w, rel, "cpu.row_gather")) == ref


@pytest.mark.skipif(len(FMA_PATHS) < 2, reason="needs two paths with fused multiply-adds (avx2 and avx512)")
@pytest.mark.parametrize("c_in,c_out", [(4, 16), (3, 20), (8, 32)])
def test_bitwise_across_fma_paths(rng, restore_isa, c_in, c_out):
    rel, _ = relation(rng, 800, 900, 27, max_edges=12)
    x, w = _inputs(rng, 800, c_in, c_out, 27, mx.float32)
    results = {}
    for name in FMA_PATHS:
        _ext.set_cpu_isa(name)
        results[name] = _bytes(_conv(x, w, rel, "cpu.row_gather"))
    assert all(r == results[FMA_PATHS[0]] for r in results.values())


def test_input_gradient_view(rng, isa):
    # the input gradient runs the product over the relation's input-major view
    K, n_in, n_out, c_in, c_out = 27, 120, 150, 16, 4
    rel, edges = relation(rng, n_in, n_out, K)
    ct, w = _inputs(rng, n_out, c_out, c_in, K, mx.float32)  # w as (K, C_out, C_in)
    dx = _conv(ct, w, rel, "cpu.row_gather", _ext.View.input_major)
    expected = np.zeros((n_in, c_in))
    for o, i, k in edges:
        expected[i] += to_np(ct)[o].astype(np.float64) @ to_np(w)[k]
    np.testing.assert_allclose(to_np(dx), expected, **TOLERANCES[mx.float32])
    assert _bytes(dx) == _bytes(_conv(ct, w, rel, "cpu.gather_gemm", _ext.View.input_major))


def test_stem_layer_takes_route_with_gradients(rng):
    # a 4 -> 16 submanifold layer end to end: route log, values, input gradient
    coords = oracle.random_coords(rng, 300, 8, 2)
    feats = mx.array(rng.standard_normal((len(coords), 4)).astype(np.float32))
    w = mx.array((rng.standard_normal((16, 3, 3, 3, 4)) / 10).astype(np.float32))
    x = ml.SparseTensor(coords, feats)
    ct = mx.array(rng.standard_normal((len(coords), 16)).astype(np.float32))
    with ml.diagnostics.record() as log:
        y, (dx, dw) = mx.vjp(lambda f, w: ops.subm_conv3d(x.replace(f), w).feats, [feats, w], [ct])
        mx.eval(y, dx, dw)
    by_dir = {(r["direction"], r["route"]) for r in log if r["op"] != "map"}
    assert ("forward", "cpu.row_gather") in by_dir and ("wgrad", "cpu.wgrad_gemm") in by_dir
    edges = oracle.conv_edges(coords, coords, 3, 1, 1)
    np.testing.assert_allclose(to_np(y[0] if isinstance(y, list) else y),
                               oracle.apply(edges, to_np(feats), to_np(w), len(coords)), rtol=1e-5, atol=1e-5)
    e_dx, e_dw, _ = oracle.grads(edges, to_np(feats), to_np(w), to_np(ct))
    np.testing.assert_allclose(to_np(dx), e_dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(to_np(dw), e_dw, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(e_dw).max()))


def test_needs_a_relation():
    x, w = mx.ones((4, 3)), mx.ones((1, 3, 5))
    with pytest.raises(ValueError, match="cpu.row_gather needs a relation"):
        _conv(x, w, None, "cpu.row_gather")
