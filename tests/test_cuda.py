"""CUDA routes (MLX's CUDA backend) against the oracle. Skipped without a
CUDA device; on one, every CUDA route runs and the route taken is asserted."""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import layout, ops

import oracle
from conftest import CUDA_TOLERANCES as TOL, needs_cuda, to_np

pytestmark = [pytest.mark.cuda, needs_cuda]


def case(rng, op, c_in, c_out, dtype, n=400):
    coords = oracle.random_coords(rng, n, 10, 2)
    feats = mx.array(rng.standard_normal((len(coords), c_in)).astype(np.float32)).astype(dtype)
    x = ml.SparseTensor(coords, feats)
    ks = 1 if op == "pointwise" else (2 if op in ("down", "up") else 3)
    w = mx.array((rng.standard_normal((c_out, ks, ks, ks, c_in)) / np.sqrt(c_in * ks**3)).astype(np.float32)).astype(dtype)
    if op == "subm":
        fn = lambda t, w: ops.subm_conv3d(t, w)
        edges = oracle.conv_edges(coords, coords, 3, 1, 1)
        sup = coords
    elif op == "down":
        fn = lambda t, w: ops.conv3d(t, w, stride=2)
        sup = oracle.forward_support(coords, 2, 2, 0)
        edges = oracle.conv_edges(coords, sup, 2, 2, 0)
    elif op == "up":
        fn = lambda t, w: ops.conv_transpose3d(t, w, stride=2)
        sup = coords.astype(np.int64) * np.array([1, 2, 2, 2])
        edges = oracle.transposed_edges(coords, sup, 2, 2, 0)
    else:
        fn = lambda t, w: ops.conv3d(t, w)
        sup = coords
        edges = oracle.conv_edges(coords, coords, 1)
    return x, w, fn, edges, sup


@pytest.mark.parametrize(
    "op,c_in,c_out,dtype,route",
    [
        ("subm", 32, 32, mx.float16, "cuda.sorted_mma"),
        ("subm", 64, 64, mx.bfloat16, "cuda.sorted_mma"),
        ("subm", 128, 128, mx.float16, "cuda.sorted_mma"),
        # Wider than one block: output channels tiled by 128 (or 64), input
        # channels staged 64 at a time, dW blocks of up to 128 x 128.
        ("subm", 256, 256, mx.float16, "cuda.sorted_mma"),
        ("subm", 512, 512, mx.bfloat16, "cuda.sorted_mma"),
        # Decoder widths: channel counts are run-time parameters of the kernels.
        ("subm", 1024, 1024, mx.float16, "cuda.sorted_mma"),
        ("up", 1024, 256, mx.bfloat16, "cuda.sorted_mma"),
        ("down", 192, 320, mx.float16, "cuda.sorted_mma"),
        ("up", 512, 48, mx.float16, "cuda.sorted_mma"),
        ("down", 32, 64, mx.float16, "cuda.sorted_mma"),
        ("up", 64, 32, mx.bfloat16, "cuda.sorted_mma"),
        ("subm", 24, 40, mx.float16, "cuda.fetch_on_demand"),
        ("subm", 7, 13, mx.float32, "cuda.fetch_on_demand"),
        ("pointwise", 32, 16, mx.float16, "cuda.pointwise_mma"),
        # more rows than one 64-row tile and one 256-row weight-gradient chunk
        ("pointwise", 48, 64, mx.bfloat16, "cuda.pointwise_mma"),
        ("pointwise", 24, 40, mx.float16, "cuda.pointwise"),
        ("pointwise", 12, 20, mx.float32, "cuda.fetch_on_demand"),
    ],
)
def test_cuda_forward_and_gradients(rng, op, c_in, c_out, dtype, route):
    x, w, fn, edges, sup = case(rng, op, c_in, c_out, dtype)
    with ml.diagnostics.record() as log:
        y = fn(x, w)
        mx.eval(y.feats)
    assert log[0]["route"] == route and log[0]["backend"] == "cuda"
    perm = oracle.match_rows(np.array(y.coords), sup)
    np.testing.assert_allclose(to_np(y.feats)[perm], oracle.apply(edges, to_np(x.feats), to_np(w), len(sup)), **TOL[dtype])
    g = rng.standard_normal((len(sup), c_out)).astype(np.float32)
    g_mx = mx.array(g[np.argsort(perm)]).astype(dtype)  # cotangent in our row order
    with ml.diagnostics.record() as log:
        dx, dw = mx.grad(lambda f, w: (fn(x.replace(f), w).feats * g_mx).sum(), argnums=(0, 1))(x.feats, w)
        mx.eval(dx, dw)
    directions = {r["direction"] for r in log}
    assert {"dgrad", "wgrad"} <= directions and all(r["backend"] == "cuda" for r in log)
    ex, ew, _ = oracle.grads(edges, to_np(x.feats), to_np(w), to_np(g_mx)[perm])
    np.testing.assert_allclose(to_np(dx), ex, **TOL[dtype])
    np.testing.assert_allclose(to_np(dw), ew, **TOL[dtype])


def test_cuda_weight_gradient_routes(rng):
    x, w, fn, edges, sup = case(rng, "subm", 32, 48, mx.float16)
    with ml.diagnostics.record() as log:
        mx.eval(mx.grad(lambda w: fn(x, w).feats.astype(mx.float32).sum())(w))
    assert any(r["route"] == "cuda.wgrad_mma" for r in log)
    x, w, fn, edges, sup = case(rng, "subm", 5, 6, mx.float32)
    with ml.diagnostics.record() as log:
        mx.eval(mx.grad(lambda w: fn(x, w).feats.sum())(w))
    assert any(r["route"] == "cuda.wgrad_direct" for r in log)
    # a pointwise product's weight gradient: tensor cores in half precision
    # (cuBLAS where the channels are no multiples of 16), the direct kernel
    # in float32; against the oracle
    for dtype, c_in, c_out, route in ((mx.float16, 48, 64, "cuda.pointwise_wgrad_mma"),
                                      (mx.bfloat16, 48, 64, "cuda.pointwise_wgrad_mma"),
                                      (mx.bfloat16, 24, 40, "cuda.pointwise_wgrad"),
                                      (mx.float32, 48, 64, "cuda.wgrad_direct")):
        x, w, fn, edges, sup = case(rng, "pointwise", c_in, c_out, dtype)
        g = mx.array(rng.standard_normal((len(sup), c_out)).astype(np.float32)).astype(dtype)
        with ml.diagnostics.record() as log:
            y = fn(x, w)
            perm = oracle.match_rows(np.array(y.coords), sup)
            dw = mx.grad(lambda w: (fn(x, w).feats.astype(mx.float32) * g.astype(mx.float32)).sum())(w)
            mx.eval(dw)
        assert [r["route"] for r in log if r["direction"] == "wgrad"] == [route]
        _, ew, _ = oracle.grads(edges, to_np(x.feats), to_np(w), to_np(g)[perm])
        np.testing.assert_allclose(to_np(dw), ew, **TOL[dtype])


def test_cuda_jvp_and_compile(rng):
    x, w, fn, edges, sup = case(rng, "subm", 32, 32, mx.float16)
    tx = mx.array(rng.standard_normal(x.feats.shape).astype(np.float32)).astype(mx.float16)
    (_,), (ty,) = mx.jvp(lambda f: [fn(x.replace(f), w).feats], [x.feats], [tx])
    ref = oracle.apply(edges, to_np(tx), to_np(w), len(sup))
    np.testing.assert_allclose(to_np(ty), ref, **TOL[mx.float16])
    comp = mx.compile(lambda f: fn(x.replace(f), w).feats)
    np.testing.assert_allclose(to_np(comp(x.feats)), to_np(fn(x, w).feats), rtol=1e-3, atol=1e-3)


def test_float32_routes_accumulate_in_float32(rng):
    # The precision contract (docs/semantics.md): mlx_lattice's CUDA routes
    # keep float32 products in float32 even while MLX runs its own float32
    # matmuls in TF32; TF32 rounding (~5e-4 per product) would miss this bound.
    x, w, fn, edges, sup = case(rng, "subm", 64, 64, mx.float32)
    with ml.diagnostics.record() as log:
        y = fn(x, w)
        mx.eval(y.feats)
    assert log[0]["backend"] == "cuda"
    perm = oracle.match_rows(np.array(y.coords), sup)
    expected = oracle.apply(edges, to_np(x.feats), to_np(w), len(sup))
    np.testing.assert_allclose(to_np(y.feats)[perm], expected, rtol=1e-5, atol=1e-5)


def test_symmetric_input_gradient_needs_no_flipped_view(rng):
    # A centred odd submanifold relation: the input gradient runs on the same
    # view with mirrored offsets (its correctness: the test above).
    x, w, fn, edges, sup = case(rng, "subm", 32, 32, mx.float16)
    mx.eval(mx.grad(lambda f: fn(x.replace(f), w).feats.astype(mx.float32).sum())(x.feats))
    rels = [r for r, _ in x.manager._relations.values() if r is not None and r.kind == "submanifold"]
    assert len(rels) == 1 and rels[0].symmetric
    # no swapped relation (nor its Plans) was made
    assert rels[0]._swapped is None and rels[0]._views._swapped is None


@pytest.mark.parametrize(
    "op,c_in,c_out,dtype,route",
    [
        ("subm", 32, 48, mx.float16, "cuda.sorted_mma"),  # W read transposed and mirrored
        ("down", 32, 16, mx.float16, "cuda.sorted_mma"),  # transposed, flipped view
        ("subm", 7, 13, mx.float32, "cuda.fetch_on_demand"),
        ("pointwise", 32, 16, mx.float16, "cuda.pointwise_mma"),
        ("pointwise", 24, 40, mx.float16, "cuda.pointwise"),
    ],
)
def test_input_gradient_reads_weight_in_place_to_second_order(rng, op, c_in, c_out, dtype, route):
    """The input gradient's product reads W transposed (and mirrored on a
    symmetric relation) where it lies; its gradient with respect to W (a
    second-order derivative of the layer) against the oracle."""
    x, w, fn, edges, sup = case(rng, op, c_in, c_out, dtype)
    y = fn(x, w)
    perm = oracle.match_rows(np.array(y.coords), sup)
    g = rng.standard_normal((len(sup), c_out)).astype(np.float32)
    g_mx = mx.array(g[np.argsort(perm)]).astype(dtype)

    def dx_of(w):
        return mx.vjp(lambda f: fn(x.replace(f), w).feats, [x.feats], [g_mx])[1][0]

    with ml.diagnostics.record() as log:
        dx = dx_of(w)
        dw2 = mx.grad(lambda w: (dx_of(w).astype(mx.float32) ** 2).sum())(w)
        mx.eval(dx, dw2)
    assert any(r["direction"] == "dgrad" and r["route"] == route for r in log)
    wm, gg = oracle.mapped(to_np(w)), to_np(g_mx)[perm].astype(np.float64)
    ex = np.zeros((len(x.coords), c_in))
    for o, i, k in edges:
        ex[i] += wm[k].T @ gg[o]
    ew = np.zeros_like(wm)
    for o, i, k in edges:
        ew[k] += 2.0 * np.outer(gg[o], to_np(dx)[i])
    ew5 = ew.transpose(1, 0, 2).reshape(w.shape)
    np.testing.assert_allclose(to_np(dx), ex, **TOL[dtype])
    tol = TOL[dtype]
    np.testing.assert_allclose(to_np(dw2), ew5, rtol=tol["rtol"], atol=tol["atol"] * max(1.0, np.abs(ew5).max()))


@pytest.mark.parametrize("c_in,c_out", [(128, 128), (32, 48)])
def test_sorted_mma_row_tiles_agree_bitwise(rng, c_in, c_out):
    """64- and 128-row blocks sum every row in the same order: the same bits,
    forward and with the weight read transposed and mirrored."""
    from mlx_lattice.backends import cuda

    x, w, fn, edges, sup = case(rng, "subm", c_in, c_out, mx.float16, n=700)
    fn(x, w)
    rels = [r for r, _ in x.manager._relations.values() if r is not None and r.kind == "submanifold"]
    view = cuda.view_of(rels[0])
    wk = layout.mapped_weight(w)
    ct = mx.array(rng.standard_normal((len(sup), c_out)).astype(np.float32)).astype(mx.float16)
    outs = {}
    for tm in (64, 128):
        y = cuda.routes.sorted_mma(x.feats, wk, view, tm=tm)
        dx = cuda.routes.sorted_mma(ct, wk, view, tm=tm, flip=(True, True))
        mx.eval(y, dx)
        outs[tm] = (to_np(y).tobytes(), to_np(dx).tobytes())
    assert outs[64] == outs[128]
