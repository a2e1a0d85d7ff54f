"""Grouped and depthwise convolution against per-group dense convolutions."""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import diagnostics, nn, ops, routes

import oracle
from conftest import TOLERANCES, assert_same_across_threads, to_np

# (C_in, C_out, groups): grouped, depthwise, depthwise with a channel
# multiplier, awkward counts.
# (34, 34, 2) and (40, 80, 2): groups of at least one SIMD vector of outputs,
# with a tail.
CHANNELS = [
    (12, 8, 4), (3, 3, 3), (3, 6, 3), (17, 17, 17), (6, 9, 3), (130, 130, 130), (4, 2, 2),
    (34, 34, 2), (40, 80, 2),
]


def make(rng, c_in, n=50, extent=6, batches=2, dtype=mx.float32):
    coords = oracle.random_coords(rng, n, extent, batches)
    feats = rng.standard_normal((len(coords), c_in)).astype(np.float32)
    return ml.SparseTensor(coords, mx.array(feats).astype(dtype)), coords, feats


def grouped_weight(rng, c_out, ks, c_in, groups, dtype=mx.float32):
    ks = (ks,) * 3 if isinstance(ks, int) else ks
    ag = c_in // groups
    w = rng.standard_normal((c_out, *ks, ag)).astype(np.float32) / np.sqrt(ag * np.prod(ks))
    return mx.array(w).astype(dtype)


def as_f64(a):
    return to_np(a).astype(np.float64)


def check_rows(y, expected_coords, expected, tol):
    perm = oracle.match_rows(np.array(y.coords), expected_coords)
    np.testing.assert_allclose(to_np(y.feats)[perm], expected, **tol)


@pytest.mark.parametrize("c_in,c_out,groups", CHANNELS)
@pytest.mark.parametrize("ks,stride,padding,dilation", [
    (3, 1, 0, 1), (2, 2, 0, 1), (3, 2, 1, 1), (3, 1, 1, 2), ((3, 1, 2), (2, 1, 1), (1, 0, 0), 1), (1, 1, 0, 1),
])
def test_conv3d(rng, c_in, c_out, groups, ks, stride, padding, dilation):
    x, coords, feats = make(rng, c_in)
    w = grouped_weight(rng, c_out, ks, c_in, groups)
    b = mx.array(rng.standard_normal(c_out).astype(np.float32))
    y = ops.conv3d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    support = oracle.forward_support(coords, ks, stride, padding, dilation)
    if ks == 1 and stride == 1 and padding == 0:
        support = coords
    expected = oracle.grouped(
        oracle.dense_conv, coords, feats, np.array(w), support, groups,
        stride=stride, padding=padding, dilation=dilation,
    ) + np.array(b)
    check_rows(y, support, expected, TOLERANCES[mx.float32])


@pytest.mark.parametrize("c_in,c_out,groups", CHANNELS)
@pytest.mark.parametrize("ks,dilation", [(3, 1), (2, 1), (5, 1), (3, 2), (1, 1)])
def test_subm_conv3d(rng, c_in, c_out, groups, ks, dilation):
    x, coords, feats = make(rng, c_in)
    w = grouped_weight(rng, c_out, ks, c_in, groups)
    y = ops.subm_conv3d(x, w, dilation=dilation, groups=groups)
    np.testing.assert_array_equal(np.array(y.coords), coords)
    expected = oracle.grouped(
        oracle.dense_conv, coords, feats, np.array(w), coords, groups,
        padding=oracle.subm_padding(ks, dilation), dilation=dilation,
    )
    np.testing.assert_allclose(to_np(y.feats), expected, **TOLERANCES[mx.float32])


@pytest.mark.parametrize("c_in,c_out,groups", CHANNELS)
@pytest.mark.parametrize("ks,stride,padding", [(3, 2, 1), (2, 2, 0), (3, 1, 1)])
def test_conv_transpose3d(rng, c_in, c_out, groups, ks, stride, padding):
    x, coords, feats = make(rng, c_in)
    w = grouped_weight(rng, c_out, ks, c_in, groups)
    y = ops.conv_transpose3d(x, w, stride=stride, padding=padding, groups=groups)
    y1 = ops.conv_transpose3d(x, mx.zeros((1, *w.shape[1:4], c_in)), stride=stride, padding=padding)
    np.testing.assert_array_equal(np.array(y.coords), np.array(y1.coords))
    out = np.array(y.coords)
    expected = oracle.grouped(
        oracle.dense_conv_transpose, coords, feats, np.array(w), out, groups,
        stride=stride, padding=padding,
    )
    np.testing.assert_allclose(to_np(y.feats), expected, **TOLERANCES[mx.float32])


@pytest.mark.parametrize("c_in,c_out,groups", CHANNELS)
@pytest.mark.parametrize("ks,stride,padding,dilation", [(2, 2, 0, 1), (3, 1, 1, 1), (3, 2, 0, 2)])
def test_generative_conv_transpose3d(rng, c_in, c_out, groups, ks, stride, padding, dilation):
    x, coords, feats = make(rng, c_in)
    w = grouped_weight(rng, c_out, ks, c_in, groups)
    y = ops.generative_conv_transpose3d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    support = oracle.generative_support(coords, ks, stride, padding, dilation)
    expected = oracle.grouped(
        oracle.dense_conv_transpose, coords, feats, np.array(w), support, groups,
        stride=stride, padding=padding, dilation=dilation,
    )
    check_rows(y, support, expected, TOLERANCES[mx.float32])


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("c_in,c_out,groups", [(12, 8, 4), (17, 34, 17), (130, 130, 130), (40, 80, 2)])
def test_dtypes(rng, dtype, c_in, c_out, groups):
    x, coords, _ = make(rng, c_in, dtype=dtype)
    w = grouped_weight(rng, c_out, 3, c_in, groups, dtype)
    y = ops.subm_conv3d(x, w, groups=groups)
    assert y.feats.dtype == dtype
    expected = oracle.grouped(
        oracle.dense_conv, coords, as_f64(x.feats), as_f64(w), coords, groups, padding=1,
    )
    np.testing.assert_allclose(to_np(y.feats), expected, **TOLERANCES[dtype])


def test_empty_and_single_batch(rng):
    w = grouped_weight(rng, 6, 3, 6, 3)
    empty = ml.SparseTensor(np.zeros((0, 4), np.int32), mx.zeros((0, 6)))
    for y in (
        ops.conv3d(empty, w, groups=3),
        ops.subm_conv3d(empty, w, groups=3),
        ops.conv_transpose3d(empty, w, stride=2, groups=3),
        ops.generative_conv_transpose3d(empty, w, stride=2, groups=3),
    ):
        assert y.feats.shape == (0, 6)
    g = mx.grad(lambda f, w: ops.subm_conv3d(empty.replace(f), w, groups=3).feats.sum(), argnums=(0, 1))(
        empty.feats, w
    )
    assert g[0].shape == (0, 6) and not np.any(to_np(g[1]))
    x, coords, feats = make(rng, 6, batches=1)
    y = ops.conv3d(x, w, stride=2, groups=3)
    support = oracle.forward_support(coords, 3, 2)
    check_rows(y, support, oracle.grouped(oracle.dense_conv, coords, feats, np.array(w), support, 3, stride=2),
               TOLERANCES[mx.float32])


# ------------------------------------------------------------------ autodiff
def grad_case(rng, op, c_in, c_out, groups, dtype=mx.float32):
    """(x, w, fn(feats, w) -> SparseTensor, oracle edges, row permutation)."""
    coords = oracle.random_coords(rng, 40, 6, 2)
    x = ml.SparseTensor(coords, mx.array(rng.standard_normal((len(coords), c_in)).astype(np.float32)).astype(dtype))
    ks = {"pointwise": 1, "conv3d": 3, "subm": 3, "transpose": 3, "generative": 2}[op]
    w = grouped_weight(rng, c_out, ks, c_in, groups, dtype)
    if op == "pointwise":
        fn, sup, edges = lambda f, w: ops.conv3d(x.replace(f), w, groups=groups), coords, oracle.conv_edges(coords, coords, 1)
    elif op == "conv3d":
        sup = oracle.forward_support(coords, 3, 2, 1)
        fn, edges = lambda f, w: ops.conv3d(x.replace(f), w, stride=2, padding=1, groups=groups), oracle.conv_edges(coords, sup, 3, 2, 1)
    elif op == "subm":
        fn, sup, edges = lambda f, w: ops.subm_conv3d(x.replace(f), w, groups=groups), coords, oracle.conv_edges(coords, coords, 3, 1, 1)
    elif op == "transpose":
        sup = coords.astype(np.int64) * np.array([1, 2, 2, 2])
        fn, edges = lambda f, w: ops.conv_transpose3d(x.replace(f), w, stride=2, padding=1, groups=groups), oracle.transposed_edges(coords, sup, 3, 2, 1)
    else:
        sup = oracle.generative_support(coords, 2, 2)
        fn, edges = lambda f, w: ops.generative_conv_transpose3d(x.replace(f), w, stride=2, groups=groups), oracle.transposed_edges(coords, sup, 2, 2, 0)
    perm = oracle.match_rows(np.array(fn(x.feats, w).coords), sup)
    return x, w, fn, edges, perm


GRAD_OPS = ["pointwise", "conv3d", "subm", "transpose", "generative"]
GRAD_CHANNELS = [(12, 8, 4), (17, 17, 17), (3, 6, 3), (34, 34, 2), (40, 80, 2)]


@pytest.mark.parametrize("op", GRAD_OPS)
@pytest.mark.parametrize("c_in,c_out,groups", GRAD_CHANNELS)
def test_vjp(rng, op, c_in, c_out, groups):
    x, w, fn, edges, perm = grad_case(rng, op, c_in, c_out, groups)
    g = rng.standard_normal((len(perm), c_out)).astype(np.float32)
    ct = np.zeros_like(g)
    ct[perm] = g  # cotangent in the op's row order
    loss = lambda f, w: (fn(f, w).feats * mx.array(ct)).sum()
    dx, dw = mx.grad(loss, argnums=(0, 1))(x.feats, w)
    full = oracle.expand_grouped(np.array(w), groups)
    ex, ew_full, _ = oracle.grads(edges, np.array(x.feats), full, g)
    np.testing.assert_allclose(to_np(dx), ex, **TOLERANCES[mx.float32])
    np.testing.assert_allclose(to_np(dw), oracle.compress_grouped(ew_full, groups), **TOLERANCES[mx.float32])


@pytest.mark.parametrize("op", GRAD_OPS)
@pytest.mark.parametrize("c_in,c_out,groups", GRAD_CHANNELS)
def test_jvp(rng, op, c_in, c_out, groups):
    x, w, fn, edges, perm = grad_case(rng, op, c_in, c_out, groups)
    tx = mx.array(rng.standard_normal(x.feats.shape).astype(np.float32))
    tw = mx.array(rng.standard_normal(w.shape).astype(np.float32))
    (_,), (ty,) = mx.jvp(lambda f, w: [fn(f, w).feats], [x.feats, w], [tx, tw])
    n_out = len(perm)
    expected = oracle.apply(edges, np.array(tx), oracle.expand_grouped(np.array(w), groups), n_out)
    expected += oracle.apply(edges, np.array(x.feats), oracle.expand_grouped(np.array(tw), groups), n_out)
    np.testing.assert_allclose(to_np(ty)[perm], expected, **TOLERANCES[mx.float32])


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_vjp_half(rng, dtype):
    x, w, fn, edges, perm = grad_case(rng, "subm", 12, 8, 4, dtype)
    dx, dw = mx.grad(lambda f, w: fn(f, w).feats.astype(mx.float32).sum(), argnums=(0, 1))(x.feats, w)
    g = np.ones((len(perm), 8))
    ex, ew, _ = oracle.grads(edges, as_f64(x.feats), oracle.expand_grouped(as_f64(w), 4), g)
    np.testing.assert_allclose(to_np(dx), ex, **TOLERANCES[dtype])
    np.testing.assert_allclose(to_np(dw), oracle.compress_grouped(ew, 4), **TOLERANCES[dtype])


def test_second_order(rng):
    """d/dw of sum(dL/dx): the input gradient's weight gradient (a grouped
    weight gradient of a grouped product), against finite differences of the
    linear map (exact up to rounding)."""
    x, w, fn, edges, perm = grad_case(rng, "subm", 6, 9, 3)
    gx = lambda w: mx.grad(lambda f: (fn(f, w).feats ** 2).sum())(x.feats).sum()
    gw = mx.grad(gx)(w)
    # sum(dL/dx) with L = sum(y^2) is quadratic in w: check against the oracle.
    def numpy_gx(wn):
        full = oracle.expand_grouped(wn, 3)
        y = oracle.apply(edges, np.array(x.feats), full, len(perm))
        dx, _, _ = oracle.grads(edges, np.array(x.feats), full, 2 * y)
        return dx.sum()
    wn = np.array(w).astype(np.float64)
    eps = 1e-3
    idx = [(0, 1, 1, 1, 0), (4, 0, 2, 1, 1), (8, 2, 0, 0, 1)]
    for i in idx:
        d = np.zeros_like(wn)
        d[i] = eps
        fd = (numpy_gx(wn + d) - numpy_gx(wn - d)) / (2 * eps)
        np.testing.assert_allclose(float(gw[i]), fd, rtol=1e-3, atol=1e-3)


def test_compile(rng):
    x, w, fn, edges, perm = grad_case(rng, "conv3d", 12, 8, 4)
    f = mx.compile(lambda f, w: fn(f, w).feats)
    np.testing.assert_array_equal(to_np(f(x.feats, w)), to_np(fn(x.feats, w).feats))


# ------------------------------------------------------------------ determinism
def test_thread_count_determinism(rng):
    coords = oracle.random_coords(rng, 3000, 24, 2)
    x = ml.SparseTensor(coords, mx.array(rng.standard_normal((len(coords), 130)).astype(np.float32)))
    w = grouped_weight(rng, 260, 3, 130, 130)
    run_determinism(x, w, 130)
    w = grouped_weight(rng, 96, 3, 130, 2)
    run_determinism(x, w, 2)


def run_determinism(x, w, groups):
    loss = lambda f, w: (ops.subm_conv3d(x.replace(f), w, groups=groups).feats ** 2).sum()

    def run():
        y = ops.subm_conv3d(x, w, groups=groups).feats
        dx, dw = mx.grad(loss, argnums=(0, 1))(x.feats, w)
        mx.eval(y, dx, dw)
        return y, dx, dw

    assert_same_across_threads(run, (1, 2, 5))


# ------------------------------------------------------------------ routes
def test_route_selection():
    ctx = dict(map_kind="submanifold", dtype="float32", kernel_size=(3, 3, 3), c_in=16, c_out=16)
    for backend in ("cpu", "metal", "cuda"):
        for direction in ("forward", "dgrad", "wgrad"):
            r1 = routes.select(routes.RouteContext(op="t", backend=backend, direction=direction, **ctx)).route
            assert not r1.grouped, r1.name
            sel = routes.select(routes.RouteContext(op="t", backend=backend, direction=direction, groups=4, **ctx))
            assert sel.route.grouped, sel.route.name
            if sel.route.backend != backend:
                assert sel.fallback  # explicit, recorded
    assert routes.select(routes.RouteContext(op="t", backend="cpu", groups=2, **ctx)).route.name == "cpu.grouped_gather"
    assert routes.select(
        routes.RouteContext(op="t", backend="cpu", groups=2, direction="wgrad", **ctx)
    ).route.name == "cpu.grouped_wgrad"
    for r in routes.list_routes():
        assert r["predicate"].startswith(routes.GROUPED_TEXT) == routes.get(r["name"]).grouped


def test_routes_recorded(rng, on_cpu):  # CPU route names
    x, coords, _ = make(rng, 6)
    w = grouped_weight(rng, 6, 3, 6, 6)
    with diagnostics.record() as log:
        mx.eval(mx.grad(lambda f, w: ops.subm_conv3d(x.replace(f), w, groups=6).feats.sum(), argnums=(0, 1))(x.feats, w))
    names = {e["route"] for e in log}
    assert names == {"cpu.grouped_gather", "cpu.grouped_wgrad"}
    assert all(e["groups"] == 6 for e in log)


def test_grouped_route_refuses_ungrouped_primitive(rng):
    x, coords, _ = make(rng, 4)
    with pytest.raises(ValueError, match="grouped route"):
        ml._ext.gather_conv(x.feats, mx.zeros((1, 2, 4)), None, ml._ext.View.output_major, "cpu.gather_gemm", groups=2)


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize("fn", [
    lambda x, w, g: ops.conv3d(x, w, groups=g),
    lambda x, w, g: ops.subm_conv3d(x, w, groups=g),
    lambda x, w, g: ops.conv_transpose3d(x, w, groups=g),
    lambda x, w, g: ops.generative_conv_transpose3d(x, w, groups=g),
])
def test_bad_groups(rng, fn):
    x, _, _ = make(rng, 6)
    with pytest.raises(ValueError, match="groups"):
        fn(x, mx.zeros((6, 3, 3, 3, 6)), 0)
    with pytest.raises(ValueError, match="groups"):
        fn(x, mx.zeros((6, 3, 3, 3, 1)), 4)  # does not divide C_in = 6
    with pytest.raises(ValueError, match="groups"):
        fn(x, mx.zeros((4, 3, 3, 3, 2)), 3)  # does not divide C_out = 4
    with pytest.raises(ValueError, match="groups"):
        fn(x, mx.zeros((6, 3, 3, 3, 3)), 3)  # last axis should be 6 // 3 = 2
    with pytest.raises(TypeError, match="groups"):
        fn(x, mx.zeros((6, 3, 3, 3, 2)), 3.0)
    with pytest.raises(TypeError, match="groups"):
        fn(x, mx.zeros((6, 3, 3, 3, 6)), True)


def test_quantized_weight_refused(rng):
    x, _, _ = make(rng, 64)
    qw = ml.QuantizedWeight.from_float(mx.zeros((64, 3, 3, 3, 32)), group_size=32)
    with pytest.raises(ValueError, match="groups"):
        ops.subm_conv3d(x, qw, groups=2)


# ------------------------------------------------------------------ nn
@pytest.mark.parametrize("cls,kwargs", [
    (nn.Conv3d, dict(kernel_size=3, stride=2)),
    (nn.SubmConv3d, dict(kernel_size=3)),
    (nn.ConvTranspose3d, dict(kernel_size=2, stride=2)),
    (nn.GenerativeConvTranspose3d, dict(kernel_size=2, stride=2)),
])
def test_nn_layers(rng, cls, kwargs):
    layer = cls(12, 24, groups=4, **kwargs)
    assert layer.weight.shape[-1] == 3 and layer.weight.shape[0] == 24
    assert "groups=4" in repr(layer)
    x, coords, feats = make(rng, 12)
    y = layer(x)
    op = {nn.Conv3d: ops.conv3d, nn.SubmConv3d: ops.subm_conv3d, nn.ConvTranspose3d: ops.conv_transpose3d,
          nn.GenerativeConvTranspose3d: ops.generative_conv_transpose3d}[cls]
    geom = {k: v for k, v in kwargs.items() if k != "kernel_size"}
    ref = op(x, layer.weight, layer.bias, groups=4, **geom)
    np.testing.assert_array_equal(to_np(y.feats), to_np(ref.feats))
    depthwise = cls(5, 10, groups=5, **kwargs)
    assert depthwise.weight.shape[-1] == 1
    with pytest.raises(ValueError, match="groups"):
        cls(6, 4, groups=4, **kwargs)
    with pytest.raises(TypeError, match="groups"):
        cls(6, 6, groups=2.0, **kwargs)


def test_nn_quantize_keeps_grouped_float():
    model = nn.Sequential(nn.SubmConv3d(64, 64, 3, groups=64), nn.SubmConv3d(64, 64, 3))
    with pytest.warns(nn.QuantizationWarning, match="layers.0"):
        nn.quantize(model, bits=4, group_size=64)
    assert isinstance(model.layers[0], nn.SubmConv3d)
    assert not isinstance(model.layers[1], nn.SubmConv3d)
    with pytest.raises(ValueError, match="groups"):
        nn.SubmConv3d(64, 64, 3, groups=2).to_quantized(group_size=32, bits=4)
