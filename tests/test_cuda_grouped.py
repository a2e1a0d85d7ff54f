"""Grouped and depthwise CUDA routes against the per-group oracle. Skipped
without a CUDA device; on one, the grouped routes run and are asserted."""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import ops

import oracle
from conftest import CUDA_TOLERANCES as TOL, needs_cuda, to_np

pytestmark = [pytest.mark.cuda, needs_cuda]


@pytest.mark.parametrize("c_in,c_out,groups", [(12, 8, 4), (17, 17, 17), (3, 6, 3), (130, 130, 130)])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("op", ["subm", "down", "pointwise"])
def test_grouped_forward_and_gradients(rng, c_in, c_out, groups, dtype, op):
    coords = oracle.random_coords(rng, 300, 10, 2)
    x = ml.SparseTensor(coords, mx.array(rng.standard_normal((len(coords), c_in)).astype(np.float32)).astype(dtype))
    ks = {"subm": 3, "down": 2, "pointwise": 1}[op]
    w = mx.array((rng.standard_normal((c_out, ks, ks, ks, c_in // groups)) / np.sqrt(ks**3 * c_in // groups))
                 .astype(np.float32)).astype(dtype)
    if op == "subm":
        fn, sup, edges = lambda f, w: ops.subm_conv3d(x.replace(f), w, groups=groups), coords, \
            oracle.conv_edges(coords, coords, 3, 1, 1)
    elif op == "down":
        sup = oracle.forward_support(coords, 2, 2, 0)
        fn, edges = lambda f, w: ops.conv3d(x.replace(f), w, stride=2, groups=groups), \
            oracle.conv_edges(coords, sup, 2, 2, 0)
    else:
        fn, sup, edges = lambda f, w: ops.conv3d(x.replace(f), w, groups=groups), coords, \
            oracle.conv_edges(coords, coords, 1)
    full = oracle.expand_grouped(to_np(w), groups)
    with ml.diagnostics.record() as log:
        y = fn(x.feats, w)
        mx.eval(y.feats)
    assert [e["route"] for e in log] == ["cuda.grouped_fetch_on_demand"]
    perm = oracle.match_rows(np.array(y.coords), sup)
    np.testing.assert_allclose(to_np(y.feats)[perm], oracle.apply(edges, to_np(x.feats), full, len(sup)), **TOL[dtype])
    g = rng.standard_normal((len(sup), c_out)).astype(np.float32)
    ct = np.zeros_like(g)
    ct[perm] = g
    with ml.diagnostics.record() as log:
        dx, dw = mx.grad(lambda f, w: (fn(f, w).feats.astype(mx.float32) * mx.array(ct)).sum(), argnums=(0, 1))(
            x.feats, w)
        mx.eval(dx, dw)
    assert {e["route"] for e in log} == {"cuda.grouped_fetch_on_demand", "cuda.grouped_wgrad"}
    ex, ew, _ = oracle.grads(edges, to_np(x.feats), full, g)
    np.testing.assert_allclose(to_np(dx), ex, **TOL[dtype])
    np.testing.assert_allclose(to_np(dw), oracle.compress_grouped(ew, groups), **TOL[dtype])


def test_grouped_jvp(rng):
    coords = oracle.random_coords(rng, 200, 8, 2)
    x = ml.SparseTensor(coords, mx.array(rng.standard_normal((len(coords), 6)).astype(np.float32)))
    w = mx.array(rng.standard_normal((9, 3, 3, 3, 2)).astype(np.float32))
    tx = mx.array(rng.standard_normal(x.feats.shape).astype(np.float32))
    tw = mx.array(rng.standard_normal(w.shape).astype(np.float32))
    (_,), (ty,) = mx.jvp(lambda f, w: [ops.subm_conv3d(x.replace(f), w, groups=3).feats], [x.feats, w], [tx, tw])
    edges = oracle.conv_edges(coords, coords, 3, 1, 1)
    expected = oracle.apply(edges, np.array(tx), oracle.expand_grouped(np.array(w), 3), len(coords))
    expected += oracle.apply(edges, np.array(x.feats), oracle.expand_grouped(np.array(tw), 3), len(coords))
    np.testing.assert_allclose(np.array(ty), expected, **TOL[mx.float32])
