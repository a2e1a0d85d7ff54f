"""Metal backward routes (input and weight gradients): selection by predicate
on autodiff contexts, and each route's program run through the CPU harness
against the NumPy oracle's gradients."""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import routes
from mlx_lattice.layout import mapped_weight
from mlx_lattice.routes import RouteContext

import oracle
import metal_programs
from conftest import METAL_TOLERANCES as TOL

pytestmark = metal_programs.MARKS

SCHEDULES = ("forward", "reverse", "random")
PAIRS = [(a, b) for a in (16, 32, 64) for b in (16, 32, 64)]


def ctx(direction, **kw):
    base = dict(op=f"{direction} of test", map_kind="submanifold", dtype="float32", backend="metal",
                kernel_size=None, k=27, tier="metal:test", direction=direction)
    base.update(kw)
    return RouteContext(**base)




def case(rng, n, c_in, c_out, dtype, kind="submanifold", **kw):
    """metal_programs.case with sparse targets, which leave many input rows
    without edges."""
    return metal_programs.case(rng, n, c_in, c_out, dtype, kind, targets=max(n // 4, 2), **kw)


def f64(a):
    return np.array(mx.array(a).astype(mx.float32)).astype(np.float64)


def fast_grads(edges, feats, w5, ct):
    """The oracle's gradients (dx, dW kernel-major), vectorised over edges."""
    o, i, k = edges[:, 0], edges[:, 1], edges[:, 2]
    w = oracle.mapped(f64(w5))  # (K, C_out, C_in)
    x, g = f64(feats), np.asarray(ct, np.float64)
    dx = np.zeros_like(x)
    np.add.at(dx, i, np.einsum("eba,eb->ea", w[k], g[o]))
    dw = np.zeros((w.shape[0], x.shape[1], g.shape[1]))
    np.add.at(dw, k, np.einsum("ea,eb->eab", x[i], g[o]))
    return dx, dw


def run_dgrad(route, feats, w5, rel, edges, n_out, dtype, rng, schedule="forward"):
    c_out = w5.shape[0]
    ct = mx.array(rng.standard_normal((n_out, c_out)).astype(np.float32)).astype(dtype)
    wt = mx.swapaxes(mapped_weight(w5), 1, 2)
    dx = metal_programs.conv(route, ct, wt, rel._native, view=metal_programs.INPUT_MAJOR, schedule=schedule,
                             record={"op": "dgrad", "direction": "dgrad", "map_kind": rel.kind})
    expected, _ = fast_grads(edges, feats, w5, f64(ct))
    assert not np.isnan(dx).any()
    np.testing.assert_allclose(dx.astype(np.float64), expected, **TOL[dtype])
    return float(np.max(np.abs(dx.astype(np.float64) - expected)))


def run_wgrad(route, feats, w5, rel, edges, n_out, dtype, rng, schedule="forward", long_sums=False):
    """long_sums: thousands of edges per offset, where a float32 sum that
    cancels to a small dW element carries an error proportional to the sum
    of the terms' magnitudes (eps32 * sum |x g|), which the bound then adds."""
    c_out = w5.shape[0]
    ct = mx.array(rng.standard_normal((n_out, c_out)).astype(np.float32)).astype(dtype)
    dw = metal_programs.weight_grad(route, feats, ct, rel._native, 27, schedule=schedule)
    _, expected = fast_grads(edges, feats, w5, f64(ct))
    assert not np.isnan(dw).any()
    err = np.abs(dw.astype(np.float64) - expected)
    if long_sums:
        _, magnitude = fast_grads(edges, np.abs(f64(feats)), w5, np.abs(f64(ct)))
        bound = TOL[dtype]["atol"] + TOL[dtype]["rtol"] * np.abs(expected) + 2.0**-23 * magnitude
        assert np.all(err <= bound), f"max error {err.max()} over the bound"
    else:
        np.testing.assert_allclose(dw.astype(np.float64), expected, **TOL[dtype])
    return float(np.max(err))


def selected(direction, rel, dtype, c_in, c_out, tensor_ops=False):
    """The route an autodiff call of this relation would take on a Mac."""
    dt = str(dtype).replace("mlx.core.", "")
    if direction == "dgrad":  # the product's channels and rows
        c = ctx("dgrad", map_kind=rel.kind, dtype=dt, c_in=c_out, c_out=c_in, n_in=rel.n_out,
                n_out=rel.n_in, edges=rel.edges, tensor_ops=tensor_ops)
    else:
        c = ctx("wgrad", map_kind=rel.kind, dtype=dt, c_in=c_in, c_out=c_out, n_in=rel.n_in,
                n_out=rel.n_out, edges=rel.edges, tensor_ops=tensor_ops)
    return routes.select(c).route.name


# ------------------------------------------------------------------ selection
@pytest.mark.parametrize(
    "kw,route",
    [
        (dict(c_in=16, c_out=16, n_out=32768, tensor_ops=True), "metal.tensorops_dgrad"),
        (dict(c_in=16, c_out=16, n_out=70000, tensor_ops=True), "metal.tensorops_dgrad"),
        (dict(c_in=16, c_out=16, n_out=32768, tensor_ops=True, weight_layout="mapped"), "metal.tensorops_dgrad"),
        (dict(c_in=16, c_out=16, n_out=32767, tensor_ops=True), "metal.dgrad_dense_channel"),
        (dict(c_in=16, c_out=16, n_out=32768, tensor_ops=False), "metal.dgrad_dense_channel"),
        (dict(c_in=16, c_out=16, n_out=32768, tensor_ops=True, k=8), "metal.dgrad_dense_channel"),
        (dict(c_in=16, c_out=16, n_out=32768, tensor_ops=True, dtype="float16"), "metal.dgrad_dense_channel"),
        (dict(c_in=32, c_out=64, n_out=65536), "metal.dgrad_dense_grouped"),
        (dict(c_in=16, c_out=16, n_out=65536), "metal.dgrad_dense_grouped"),
        (dict(c_in=32, c_out=64, n_out=65535), "metal.dgrad_dense_channel"),
        (dict(c_in=64, c_out=16, n_out=4096, dtype="float16"), "metal.dgrad_dense_channel"),
        # below the seed routes' thresholds: the matrix-unit route (vec4 and
        # fp16_gather before it)
        (dict(c_in=32, c_out=64, n_out=4095), "metal.csr_mma"),
        (dict(c_in=32, c_out=64, n_out=4095, dtype="float16"), "metal.csr_mma"),
        (dict(c_in=32, c_out=64, n_out=5000, weight_layout="mapped"), "metal.csr_mma"),
        (dict(c_in=32, c_out=64, n_out=5000, dtype="bfloat16"), "metal.csr_mma"),
        (dict(c_in=24, c_out=16, n_out=5000), "metal.cout16"),
    ],
)
def test_dgrad_selection(kw, route):
    assert routes.select(ctx("dgrad", **kw)).route.name == route


@pytest.mark.parametrize(
    "kw,route",
    [
        (dict(c_in=32, c_out=64, n_in=32768, tensor_ops=True), "metal.tensorops_wgrad"),
        (dict(c_in=16, c_out=16, n_in=32768, tensor_ops=True, dtype="float16"), "metal.tensorops_wgrad"),
        # outside the seed's predicate on TensorOps: the matrix-unit weight
        # gradient's TensorOps twin
        (dict(c_in=32, c_out=64, n_in=32767, tensor_ops=True), "metal.tensorops_wgrad_mma"),
        (dict(c_in=32, c_out=64, n_in=32768, tensor_ops=True, k=8), "metal.tensorops_wgrad_mma"),
        (dict(c_in=48, c_out=64, n_in=32768, tensor_ops=True), "metal.tensorops_wgrad_mma"),
        # without TensorOps: the matrix-unit weight gradient, where the scalar
        # wgrad_* routes (block4, dense_square, fp16, cout16, direct) were
        # taken before
        (dict(c_in=32, c_out=64, n_in=32768, tensor_ops=False), "metal.wgrad_mma"),
        (dict(c_in=32, c_out=32, edges=4096), "metal.wgrad_mma"),
        (dict(c_in=64, c_out=64, edges=4096, dtype="float16"), "metal.wgrad_mma"),
        (dict(c_in=32, c_out=32, edges=4095), "metal.wgrad_mma"),
        (dict(c_in=32, c_out=32, edges=4095, dtype="float16"), "metal.wgrad_mma"),
        (dict(c_in=7, c_out=16), "metal.wgrad_mma"),
        (dict(c_in=7, c_out=16, dtype="float16"), "metal.wgrad_mma"),
        (dict(c_in=8, c_out=12), "metal.wgrad_mma"),
        (dict(c_in=7, c_out=12), "metal.wgrad_mma"),
        (dict(c_in=7, c_out=12, dtype="float16"), "metal.wgrad_mma"),
        (dict(c_in=32, c_out=32, edges=4096, dtype="bfloat16"), "metal.wgrad_mma"),
    ],
)
def test_wgrad_selection(kw, route):
    assert routes.select(ctx("wgrad", **kw)).route.name == route


def test_backward_routes_serve_only_their_pass():
    for name in ("metal.tensorops_dgrad", "metal.dgrad_dense_grouped", "metal.dgrad_dense_channel"):
        assert routes.get(name).passes == ("dgrad",)
    for name in ("metal.tensorops_wgrad", "metal.wgrad_dense_square", "metal.wgrad_cout16",
                 "metal.wgrad_block4", "metal.wgrad_fp16"):
        assert routes.get(name).passes == ("wgrad",)
    # a forward context never takes a backward route
    fwd = routes.select(ctx("forward", c_in=16, c_out=16, n_out=70000, n_in=70000, tensor_ops=True))
    assert fwd.route.name == "metal.dense_channel"


# ------------------------------------------------------------------ input gradient
@pytest.mark.parametrize("c_in,c_out,dtype", [(16, 64, mx.float32), (64, 32, mx.float16)])
def test_dgrad_dense_channel_on_selecting_shape(rng, dtype, c_in, c_out):
    feats, w5, rel, edges, n_out = case(rng, 5600, c_in, c_out, dtype, extent=22, batches=1)
    assert rel.n_in >= 4096
    assert selected("dgrad", rel, dtype, c_in, c_out) == "metal.dgrad_dense_channel"
    run_dgrad("metal.dgrad_dense_channel", feats, w5, rel, edges, n_out, dtype, rng)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("c_in,c_out", PAIRS)
def test_dgrad_dense_grouped(rng, dtype, c_in, c_out):
    # every instantiation; input rows not a multiple of a group's 4 x 64 rows,
    # target relations leave input rows without edges (zero rows)
    kind = ("target", "forward", "submanifold")[(c_in + c_out) % 3]
    feats, w5, rel, edges, n_out = case(rng, 150, c_in, c_out, dtype, kind)
    schedule = SCHEDULES[(c_in // 16 + c_out // 32) % 3]
    run_dgrad("metal.dgrad_dense_grouped", feats, w5, rel, edges, n_out, dtype, rng, schedule)


def test_dgrad_input_neighbor_map(rng):
    feats, w5, rel, edges, n_out = case(rng, 80, 4, 4, mx.float32, "target")
    nm = np.array(rel._native.input_neighbor_map)
    assert nm.shape == (rel.n_in, 27)
    expected = np.full((rel.n_in, 27), -1)
    expected[edges[:, 1], edges[:, 2]] = edges[:, 0]
    assert np.array_equal(nm, expected)
    assert (nm < 0).all(axis=1).any()  # some input rows have no edge


@pytest.mark.parametrize("kind,schedule", [("submanifold", "forward"), ("forward", "reverse"), ("target", "random")])
def test_tensorops_dgrad(rng, kind, schedule):
    feats, w5, rel, edges, n_out = case(rng, 430, 16, 16, mx.float32, kind)
    assert rel.n_in % 64 != 0  # a partly filled last tile
    err = run_dgrad("metal.tensorops_dgrad", feats, w5, rel, edges, n_out, mx.float32, rng, schedule)
    # and equal (to rounding) to the dense-channel route on the same product
    assert err < 1e-4


def test_tensorops_dgrad_program_refuses_other_shapes(rng):
    feats, w5, rel, edges, n_out = case(rng, 60, 16, 32, mx.float32)
    ct = mx.zeros((n_out, 32))
    with pytest.raises(ValueError, match="C_in == C_out == 16"):
        metal_programs.conv("metal.tensorops_dgrad", ct, mx.swapaxes(mapped_weight(w5), 1, 2), rel._native, view=metal_programs.INPUT_MAJOR)


# ------------------------------------------------------------------ weight gradient
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("c_in,c_out", PAIRS)
def test_tensorops_wgrad(rng, dtype, c_in, c_out):
    kind = ("submanifold", "target", "forward")[(c_in + 2 * c_out) % 3]
    feats, w5, rel, edges, n_out = case(rng, 120, c_in, c_out, dtype, kind)
    schedule = SCHEDULES[(c_in // 16 + c_out // 16) % 3]
    run_wgrad("metal.tensorops_wgrad", feats, w5, rel, edges, n_out, dtype, rng, schedule)


def test_tensorops_wgrad_partitions(rng):
    """Enough edges per offset for several partitions, summed in order."""
    feats, w5, rel, edges, n_out = case(rng, 3000, 16, 32, mx.float32, extent=16, batches=1)
    prog = ml._ext.metal_program("weight_grad", "metal.tensorops_wgrad",
                                 ml._ext.weight_grad_inputs(feats, mx.zeros((n_out, 32)), rel._native, metal_programs.OUTPUT_MAJOR),
                                 [27, 16, 32], mx.float32)
    parts = prog["steps"][0]["groups"][0]
    assert parts > 1 and prog["steps"][1]["kernel"] == "wgrad_reduce_float32"
    run_wgrad("metal.tensorops_wgrad", feats, w5, rel, edges, n_out, mx.float32, rng, "random")


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("c", [16, 32, 64])
def test_wgrad_dense_square(rng, dtype, c):
    feats, w5, rel, edges, n_out = case(rng, 200, c, c, dtype, ("submanifold", "forward", "target")[c // 32])
    run_wgrad("metal.wgrad_dense_square", feats, w5, rel, edges, n_out, dtype, rng, SCHEDULES[c // 32])


def test_wgrad_dense_square_on_selecting_shape(rng):
    feats, w5, rel, edges, n_out = case(rng, 700, 16, 16, mx.float32, extent=10, batches=1)
    assert rel.edges >= 4096
    assert selected("wgrad", rel, mx.float32, 16, 16) == "metal.wgrad_mma"  # wgrad_dense_square before
    run_wgrad("metal.wgrad_dense_square", feats, w5, rel, edges, n_out, mx.float32, rng)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("c_in", [3, 70])
def test_wgrad_cout16(rng, dtype, c_in):
    feats, w5, rel, edges, n_out = case(rng, 150, c_in, 16, dtype, "forward")
    assert selected("wgrad", rel, dtype, c_in, 16) == "metal.wgrad_mma"  # wgrad_cout16 before
    run_wgrad("metal.wgrad_cout16", feats, w5, rel, edges, n_out, dtype, rng, "reverse")


@pytest.mark.parametrize("c_in,c_out", [(4, 8), (12, 36)])
def test_wgrad_block4(rng, c_in, c_out):
    feats, w5, rel, edges, n_out = case(rng, 150, c_in, c_out, mx.float32, "target")
    assert selected("wgrad", rel, mx.float32, c_in, c_out) == "metal.wgrad_mma"  # wgrad_block4 before
    run_wgrad("metal.wgrad_block4", feats, w5, rel, edges, n_out, mx.float32, rng, "random")


@pytest.mark.parametrize("c_in,c_out", [(3, 5), (40, 33)])
def test_wgrad_fp16(rng, c_in, c_out):
    feats, w5, rel, edges, n_out = case(rng, 150, c_in, c_out, mx.float16)
    assert selected("wgrad", rel, mx.float16, c_in, c_out) == "metal.wgrad_mma"  # wgrad_fp16 before
    run_wgrad("metal.wgrad_fp16", feats, w5, rel, edges, n_out, mx.float16, rng, "random")


@pytest.mark.parametrize(
    "route,dtype,c_in,c_out",
    [("metal.wgrad_fp16", mx.float16, 5, 9), ("metal.wgrad_block4", mx.float32, 8, 4),
     ("metal.wgrad_cout16", mx.float32, 5, 16), ("metal.wgrad_dense_square", mx.float16, 32, 32)],
)
def test_wgrad_pointwise(rng, route, dtype, c_in, c_out):
    """Without a relation (1x1x1 products) every classic kernel reads row e."""
    n = 77
    x = rng.standard_normal((n, c_in)).astype(np.float32)
    ct = rng.standard_normal((n, c_out)).astype(np.float32)
    dw = metal_programs.weight_grad(route, mx.array(x).astype(dtype), mx.array(ct).astype(dtype), None, 1)
    xe, ce = f64(mx.array(x).astype(dtype)), f64(mx.array(ct).astype(dtype))
    np.testing.assert_allclose(dw[0].astype(np.float64), xe.T @ ce, **TOL[dtype])


# ------------------------------------------------------------------ selecting sizes
# The capacity thresholds of these routes are large; the kernels do not depend
# on size, and the fast tests above run them on small relations. These run
# them on relations that select them (slow: pytest -m slow).
@pytest.mark.slow
def test_dgrad_dense_grouped_on_selecting_shape(rng):
    feats, w5, rel, edges, n_out = case(rng, 110000, 16, 16, mx.float32, extent=52, batches=1)
    assert rel.n_in >= 65536
    assert selected("dgrad", rel, mx.float32, 16, 16) == "metal.dgrad_dense_grouped"
    run_dgrad("metal.dgrad_dense_grouped", feats, w5, rel, edges, n_out, mx.float32, rng)


@pytest.mark.slow
def test_tensorops_dgrad_on_selecting_shape(rng):
    feats, w5, rel, edges, n_out = case(rng, 50000, 16, 16, mx.float32, extent=40, batches=1)
    assert 32768 <= rel.n_in < 65536
    assert selected("dgrad", rel, mx.float32, 16, 16, tensor_ops=True) == "metal.tensorops_dgrad"
    run_dgrad("metal.tensorops_dgrad", feats, w5, rel, edges, n_out, mx.float32, rng)


@pytest.mark.slow
def test_tensorops_wgrad_on_selecting_shape(rng):
    feats, w5, rel, edges, n_out = case(rng, 50000, 32, 16, mx.float32, extent=40, batches=1)
    assert rel.n_in >= 32768
    assert selected("wgrad", rel, mx.float32, 32, 16, tensor_ops=True) == "metal.tensorops_wgrad"
    run_wgrad("metal.tensorops_wgrad", feats, w5, rel, edges, n_out, mx.float32, rng, long_sums=True)
