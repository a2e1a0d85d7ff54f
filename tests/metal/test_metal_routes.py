"""Metal forward routes: selection by predicate, and each route's program run
through the CPU harness (on a Mac: the same program on the GPU via MLX)
against the oracle, including boundary shapes."""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import routes
from mlx_lattice.layout import mapped_weight
from mlx_lattice.relation import KernelGeometry
from mlx_lattice.routes import RouteContext

import oracle
import metal_programs
from conftest import METAL_TOLERANCES as TOL
from metal_programs import case

pytestmark = metal_programs.MARKS



def metal_ctx(**kw):
    base = dict(op="conv3d", map_kind="submanifold", dtype="float32", backend="metal",
                kernel_size=(3, 3, 3), tier="metal:test")
    base.update(kw)
    return RouteContext(**base)




def select(rel, dtype, c_in, c_out, **kw):
    ctx = metal_ctx(map_kind=rel.kind, dtype=str(dtype).replace("mlx.core.", ""), c_in=c_in, c_out=c_out,
                    n_in=rel.n_in, n_out=rel.n_out, edges=rel.edges, **kw)
    return routes.select(ctx).route.name, ctx


def check_route(route, feats, w5, rel, edges, n_out, dtype, schedule="forward", log=None):
    record = None
    if log is not None:
        record = {"op": "conv3d", "map_kind": rel.kind, "dtype": str(dtype), "n_out": n_out}
    y = metal_programs.conv(route, feats, mapped_weight(w5), rel._native, metal_programs.OUTPUT_MAJOR, schedule=schedule, record=record)
    expected = oracle.apply(edges, np.array(feats.astype(mx.float32)), np.array(w5.astype(mx.float32)), n_out)
    np.testing.assert_allclose(y.astype(np.float64), expected, **TOL[dtype])


# ------------------------------------------------------------------ selection
@pytest.mark.parametrize(
    "kw,route",
    [
        (dict(kernel_size=(1, 1, 1), map_kind="forward"), "metal.pointwise"),
        (dict(dtype="float16", c_in=32, c_out=32), "metal.sorted_gemm"),
        (dict(dtype="float16", c_in=64, c_out=64, map_kind="target"), "metal.sorted_gemm"),
        (dict(dtype="float16", c_in=64, c_out=64, map_kind="transposed", n_out=5000), "metal.dense_channel"),
        (dict(dtype="float16", c_in=32, c_out=64, n_out=4096), "metal.dense_channel"),
        # below the seed routes' thresholds the matrix-unit route takes the
        # calls the scalar routes (vec4, fp16_gather, fp32_atomic) took
        (dict(dtype="float16", c_in=32, c_out=64, n_out=4095), "metal.csr_mma"),
        (dict(c_in=16, c_out=16, n_out=4096), "metal.dense_channel"),
        (dict(c_in=16, c_out=16, n_out=4096, weight_layout="mapped"), "metal.cout16"),
        (dict(c_in=7, c_out=16, n_out=4096), "metal.cout16"),
        (dict(c_in=7, c_out=16, n_out=4095), "metal.csr_mma"),
        (dict(c_in=7, c_out=16, n_out=50000, kernel_size=(2, 2, 2)), "metal.cout16"),
        (dict(c_in=7, c_out=16, n_out=49999, kernel_size=(2, 2, 2)), "metal.csr_mma"),
        (dict(c_in=7, c_out=12), "metal.csr_mma"),
        (dict(c_in=7, c_out=13), "metal.csr_mma"),
        (dict(dtype="float16", c_in=7, c_out=13), "metal.csr_mma"),
        (dict(dtype="float16", c_in=64, c_out=64, kernel_size=(5, 5, 1)), "metal.csr_mma"),
        (dict(dtype="float16", c_in=32, c_out=32, kernel_size=(3, 3, 1), n_out=100), "metal.csr_mma"),
        (dict(dtype="bfloat16", c_in=32, c_out=32), "metal.csr_mma"),
        (dict(dtype="bfloat16", kernel_size=(1, 1, 1), map_kind="forward"), "metal.csr_mma"),
    ],
)
def test_route_selection(kw, route):
    assert routes.select(metal_ctx(**kw)).route.name == route


def test_atomic_route_is_marked_nondeterministic():
    assert not routes.get("metal.fp32_atomic").deterministic
    assert all(routes.get(n).deterministic for n in ("metal.vec4", "metal.sorted_gemm", "metal.dense_channel"))


# ------------------------------------------------------------------ execution
@pytest.mark.parametrize("kind", ["submanifold", "forward", "target"])
@pytest.mark.parametrize("c", [32, 64])
def test_sorted_gemm(rng, kind, c):
    feats, w5, rel, edges, n_out = case(rng, 300, c, c, mx.float16, kind)
    route, _ = select(rel, mx.float16, c, c)
    assert route == "metal.sorted_gemm"
    assert n_out % 64 != 0  # a partly filled last tile
    check_route(route, feats, w5, rel, edges, n_out, mx.float16)


def test_sorted_plan_tiles_skip_offsets(rng):
    feats, w5, rel, edges, n_out = case(rng, 200, 32, 32, mx.float16)
    masks = np.array(rel.sorted_plan().tile_masks)
    assert np.any(masks != (1 << 27) - 1)  # some tiles skip offsets
    check_route("metal.sorted_gemm", feats, w5, rel, edges, n_out, mx.float16, schedule="reverse")


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("c_in,c_out", [(16, 64), (64, 16)])
def test_dense_channel(rng, dtype, c_in, c_out):
    feats, w5, rel, edges, n_out = case(rng, 5600, c_in, c_out, dtype, extent=22, batches=1)
    assert n_out >= 4096
    route, _ = select(rel, dtype, c_in, c_out)
    assert route == "metal.dense_channel"
    check_route(route, feats, w5, rel, edges, n_out, dtype)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_cout16(rng, dtype):
    feats, w5, rel, edges, n_out = case(rng, 5600, 5, 16, dtype, extent=22, batches=1)
    route, _ = select(rel, dtype, 5, 16)
    assert route == "metal.cout16"
    check_route(route, feats, w5, rel, edges, n_out, dtype, schedule="random")


# The scalar routes: what they served is metal.csr_mma's now (selection),
# their kernels stay registered and checked on the same shapes.
@pytest.mark.parametrize("c_in,c_out", [(3, 4), (13, 20), (1, 8)])
def test_vec4(rng, c_in, c_out):
    feats, w5, rel, edges, n_out = case(rng, 150, c_in, c_out, mx.float32, "forward")
    route, _ = select(rel, mx.float32, c_in, c_out)
    assert route == "metal.csr_mma"
    check_route("metal.vec4", feats, w5, rel, edges, n_out, mx.float32)


@pytest.mark.parametrize("c_in,c_out", [(3, 5), (33, 7), (16, 130)])
def test_fp16_gather(rng, c_in, c_out):
    feats, w5, rel, edges, n_out = case(rng, 120, c_in, c_out, mx.float16, "target")
    route, _ = select(rel, mx.float16, c_in, c_out)
    assert route == "metal.csr_mma"
    check_route("metal.fp16_gather", feats, w5, rel, edges, n_out, mx.float16, schedule="random")


@pytest.mark.parametrize("c_in,c_out", [(3, 5), (9, 1)])
def test_fp32_atomic(rng, c_in, c_out):
    feats, w5, rel, edges, n_out = case(rng, 150, c_in, c_out, mx.float32)
    route, _ = select(rel, mx.float32, c_in, c_out)
    assert route == "metal.csr_mma"
    check_route("metal.fp32_atomic", feats, w5, rel, edges, n_out, mx.float32, schedule="reverse")


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_fetch_on_demand_and_pointwise(rng, dtype):
    feats, w5, rel, edges, n_out = case(rng, 100, 6, 7, dtype, "forward")
    check_route("metal.fetch_on_demand", feats, w5, rel, edges, n_out, dtype)
    w1 = mx.array(rng.standard_normal((9, 1, 1, 1, 6)).astype(np.float32)).astype(dtype)
    y = metal_programs.conv("metal.pointwise", feats, mapped_weight(w1), None)
    expected = np.array(feats.astype(mx.float32)) @ np.array(w1.astype(mx.float32))[:, 0, 0, 0, :].T
    np.testing.assert_allclose(y.astype(np.float64), expected, **TOL[dtype])


@pytest.mark.parametrize("route", ["metal.vec4", "metal.cout16", "metal.fetch_on_demand"])
def test_input_gradient_routes(rng, route):
    """CSR routes also serve the input gradient (input-major view, W^T)."""
    c_out = 12  # the input gradient has C_in = 16 output channels
    feats, w5, rel, edges, n_out = case(rng, 150, 16, c_out, mx.float32, "forward")
    ct = rng.standard_normal((n_out, c_out)).astype(np.float32)
    wt = mx.swapaxes(mapped_weight(w5), 1, 2)
    dx = metal_programs.conv(route, mx.array(ct), wt, rel._native, view=metal_programs.INPUT_MAJOR)
    ex, _, _ = oracle.grads(edges, np.array(feats), np.array(w5), ct)
    np.testing.assert_allclose(dx, ex, rtol=1e-4, atol=1e-4)


def test_programs_reject_shapes_their_kernels_cannot_run(rng):
    feats, w5, rel, edges, n_out = case(rng, 60, 8, 12, mx.float32)
    with pytest.raises(ValueError, match="cout16"):
        metal_programs.conv("metal.cout16", feats, mapped_weight(w5), rel._native)
    w = mapped_weight(mx.zeros((13, 3, 3, 3, 8)))
    with pytest.raises(ValueError, match="vec4"):
        metal_programs.conv("metal.vec4", feats, w, rel._native)


def test_wgrad_direct_route(rng):
    feats, w5, rel, edges, n_out = case(rng, 120, 5, 6, mx.float32, "forward")
    ct = rng.standard_normal((n_out, 6)).astype(np.float32)
    dw = metal_programs.weight_grad("metal.wgrad_direct", feats, mx.array(ct), rel._native, 27)
    _, ew, _ = oracle.grads(edges, np.array(feats), np.array(w5), ct)
    # kernel-major (K, C_in, C_out) against the oracle's 5D layout
    np.testing.assert_allclose(dw, np.array(mapped_weight(mx.array(ew.astype(np.float32)))), rtol=1e-4, atol=1e-4)


def test_harness_runs_are_logged(rng, tmp_path, monkeypatch):
    path = tmp_path / "log.jsonl"
    monkeypatch.setenv("MLX_LATTICE_ROUTE_LOG", str(path))
    feats, w5, rel, edges, n_out = case(rng, 60, 4, 8, mx.float32)
    with ml.diagnostics.record() as log:
        check_route("metal.vec4", feats, w5, rel, edges, n_out, mx.float32, log=True)
    assert log[0]["backend"] == metal_programs.BACKEND and log[0]["route"] == "metal.vec4"
    assert log[0]["kernels"] == ["vec4_float32"]
    assert metal_programs.BACKEND in path.read_text()
    # weight gradients are recorded too, with their pass
    ct = mx.zeros((n_out, 8))
    with ml.diagnostics.record() as log:
        metal_programs.weight_grad("metal.wgrad_direct", feats, ct, rel._native, 27)
    assert [(r["route"], r["direction"], r["kernels"]) for r in log] == [
        ("metal.wgrad_direct", "wgrad", ["wgrad_direct_float32"])]


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("c_in", [16, 32, 64])
@pytest.mark.parametrize("c_out", [16, 32, 64])
def test_dense_channel_every_instantiation(rng, dtype, c_in, c_out):
    """Every compiled channel pair, on a small relation (the kernel does not
    depend on the capacity threshold, only the predicate does)."""
    feats, w5, rel, edges, n_out = case(rng, 90, c_in, c_out, dtype)
    check_route("metal.dense_channel", feats, w5, rel, edges, n_out, dtype)


# ------------------------------------------------------------------ TensorOps sorted route
@pytest.mark.parametrize("tensor_ops,route", [(True, "metal.tensorops_sorted"), (False, "metal.sorted_gemm")])
@pytest.mark.parametrize("kw", [dict(c_in=32, c_out=32), dict(c_in=64, c_out=64, map_kind="target"),
                                dict(c_in=64, c_out=64, map_kind="forward")])
def test_tensorops_selection_follows_the_capability(tensor_ops, route, kw):
    assert routes.select(metal_ctx(dtype="float16", tensor_ops=tensor_ops, **kw)).route.name == route


@pytest.mark.parametrize(
    "kw,route",
    [
        # outside its shapes on a TensorOps tier: metal.csr_mma's TensorOps twin
        (dict(dtype="float32", c_in=32, c_out=32), "metal.tensorops_csr_mma"),
        (dict(dtype="float16", c_in=32, c_out=64, n_out=100), "metal.tensorops_csr_mma"),
        (dict(dtype="float16", c_in=48, c_out=48, n_out=100), "metal.tensorops_csr_mma"),
        (dict(dtype="float16", c_in=32, c_out=32, kernel_size=(3, 3, 1), n_out=100),
         "metal.tensorops_csr_mma"),
        (dict(dtype="float16", c_in=64, c_out=64, map_kind="transposed", n_out=5000), "metal.dense_channel"),
        (dict(dtype="float16", c_in=32, c_out=32, quantized=True), "metal.quantized_fetch_on_demand"),
    ],
)
def test_tensorops_route_keeps_the_sorted_shape_predicate(kw, route):
    sel = routes.select(metal_ctx(tensor_ops=True, **kw))
    assert sel.route.name == route
    rejected = {r["route"]: r["reason"] for r in sel.rejected}
    assert "metal.tensorops_sorted" in rejected


def test_tensorops_program_binds_what_the_direct_route_binds():
    rng = np.random.default_rng(404)
    feats, w5, rel, edges, n_out = case(rng, 120, 32, 32, mx.float16)
    w = mapped_weight(w5)
    inputs = {r: _ext_inputs(r, feats, w, rel) for r in ("metal.sorted_gemm", "metal.tensorops_sorted")}
    for a, b in zip(*inputs.values()):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    direct, tops = (ml._ext.metal_program("conv", r, inputs[r], [n_out, 32], mx.float16)["steps"]
                    for r in inputs)
    (d,), (t,) = direct, tops
    assert t["kernel"] == "tensorops_sorted_float16_c32" and tuple(t["threads"]) == (128, 1, 1)
    assert tuple(t["groups"]) == (-(-n_out // 64), 1, 1) == tuple(d["groups"])
    assert t["buffers"] == d["buffers"]


def _ext_inputs(route, feats, w, rel):
    return ml._ext.conv_inputs(feats, w, rel._native, metal_programs.OUTPUT_MAJOR, route)


@pytest.mark.parametrize("kind", ["submanifold", "forward", "target"])
@pytest.mark.parametrize("c", [32, 64])
def test_tensorops_sorted_against_direct_route_and_oracle(kind, c):
    # Fixed seeds (these shapes must leave the last tile partly filled).
    rng = np.random.default_rng([4, c, ("submanifold", "forward", "target").index(kind)])
    feats, w5, rel, edges, n_out = case(rng, 300, c, c, mx.float16, kind)
    route, _ = select(rel, mx.float16, c, c, tensor_ops=True)
    assert route == "metal.tensorops_sorted"
    assert n_out % 64 != 0  # a partly filled last tile
    w = mapped_weight(w5)
    y = metal_programs.conv(route, feats, w, rel._native, metal_programs.OUTPUT_MAJOR, schedule="random", seed=c)
    direct = metal_programs.conv("metal.sorted_gemm", feats, w, rel._native, metal_programs.OUTPUT_MAJOR)
    expected = oracle.apply(edges, np.array(feats.astype(mx.float32)), np.array(w5.astype(mx.float32)), n_out)
    np.testing.assert_allclose(y.astype(np.float64), expected, **TOL[mx.float16])
    # Both accumulate in float and round once: at most an fp16 rounding apart.
    np.testing.assert_allclose(y.astype(np.float64), direct.astype(np.float64), rtol=2e-3, atol=2e-3)


def test_tensorops_sorted_skips_offsets_and_writes_empty_rows():
    """Target rows far from every input have no edge: zeros, written once."""
    rng = np.random.default_rng(405)
    coords = oracle.random_coords(rng, 200, 7, 2)
    far = np.array([[0, 60, 60, 60], [1, -40, 3, 3], [0, 3, 90, 3]])
    out = np.concatenate([oracle.random_coords(rng, 100, 7, 2), far]).astype(np.int32)
    x = ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32))
    m = x.manager
    geom = KernelGeometry((3, 3, 3), (1,) * 3, (1,) * 3, (1,) * 3)
    rel = m.target_kernel_relation(x.coordinate_set, m.register(mx.array(out)), geom)
    edges = oracle.conv_edges(coords, out, 3, 1, 1)
    feats = mx.array(rng.standard_normal((len(coords), 32)).astype(np.float32)).astype(mx.float16)
    w5 = mx.array((rng.standard_normal((32, 3, 3, 3, 32)) / np.sqrt(27 * 32)).astype(np.float32)).astype(mx.float16)
    masks = np.array(rel.sorted_plan().tile_masks)
    assert np.any(masks != (1 << 27) - 1)  # some tiles skip offsets
    assert (np.diff(np.array(rel._native.out_offsets))[-3:] == 0).all()
    y = metal_programs.conv("metal.tensorops_sorted", feats, mapped_weight(w5), rel._native, metal_programs.OUTPUT_MAJOR, schedule="reverse")
    expected = oracle.apply(edges, np.array(feats.astype(mx.float32)), np.array(w5.astype(mx.float32)), len(out))
    np.testing.assert_allclose(y.astype(np.float64), expected, **TOL[mx.float16])
    np.testing.assert_array_equal(y[-3:], 0)
