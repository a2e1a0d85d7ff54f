"""metal.tensorops_csr_mma (metal/tensorops_csr_mma.metal,
src/metal/tensorops_csr_mma.cpp): metal.csr_mma's program with each staged
32 x 16 by 16 x BN slice product one TensorOps matmul2d (emulated by the
harness), forward and input gradient.

Selection: every dense product (float32, float16, bfloat16) that no seed
route takes, on a TensorOps tier; never without TensorOps, where its direct
twin metal.csr_mma takes it. Execution: the route's program through the CPU
harness against sums over the oracle's edges (tests/oracle.py) and against
the twin, for every map kind, both views, kernel volumes 1, 8, 27 and 125,
channels 8 to 256 (and 1024), the three dtypes, empty relations and partial
tiles; the same bits under every thread schedule.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlx_lattice as ml
from mlx_lattice import _ext, diagnostics, mac_plan, routes
from mlx_lattice.routes import RouteContext

import metal_harness as mh
import metal_programs
import oracle
from metal_programs import geometry, relation

pytestmark = metal_programs.MARKS
BACKEND = metal_programs.BACKEND

ROUTE = "metal.tensorops_csr_mma"
TWIN = "metal.csr_mma"
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
# Against float64 sums of the same (rounded) operands: float32 accumulation,
# then one rounding to the output dtype.
TOL = {
    mx.float32: dict(rtol=1e-5, atol=1e-5),
    mx.float16: dict(rtol=2.0**-10, atol=1e-4),
    mx.bfloat16: dict(rtol=2.0**-7, atol=1e-4),
}
# Against the twin: the same float products summed in another order within
# a slice, so at most one rounding step of the dtype apart (float32: the
# float sums' own error, up to a few ulps of their terms, where they cancel).
TWIN_TOL = {
    mx.float32: dict(rtol=1e-5, atol=1e-5),
    mx.float16: dict(rtol=2.0**-10, atol=2.0**-14),
    mx.bfloat16: dict(rtol=2.0**-7, atol=2.0**-14),
}
KERNELS = {f"tensorops_csr_mma_{dt}_n{bn}" for dt in DTYPES for bn in (16, 32, 64, 128)}


# ------------------------------------------------------------------ operands
def operands(rng, rows, c_in, c_out, k, dtype):
    """x (rows, C_in) and a kernel-major weight (K, C_in, C_out) of dtype,
    scaled so that outputs are O(1)."""
    x = mx.array(rng.standard_normal((rows, c_in)).astype(np.float32)).astype(dtype)
    w = rng.standard_normal((k, c_in, c_out)) / np.sqrt(max(c_in, 1) * min(k, 9))
    return x, mx.array(w.astype(np.float32)).astype(dtype)


def f64(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)).astype(np.float64)


def reference(edges, x, w, rows, transpose=False):
    """y[o] += x[i] @ W[k] over the edges (float64); with `transpose`, the
    input gradient: dx[i] += ct[o] @ W[k]^T."""
    x, w = f64(x), f64(w)
    y = np.zeros((rows, w.shape[1] if transpose else w.shape[2]))
    o, i, k = edges[:, 0], edges[:, 1], edges[:, 2]
    dst, src = (i, o) if transpose else (o, i)
    for kk in np.unique(k):
        sel = k == kk
        wk = w[kk].T if transpose else w[kk]
        np.add.at(y, dst[sel], x[src[sel]] @ wk)
    return y


def run(x, w, rel, view=metal_programs.OUTPUT_MAJOR, schedule="forward", seed=0, route=ROUTE):
    native = None if rel is None else getattr(rel, "_native", rel)
    return metal_programs.conv(route, x, w, native, view, schedule=schedule, seed=seed)


def check(y, expected, dtype):
    assert not np.isnan(y).any(), "outputs left unwritten"
    np.testing.assert_allclose(y.astype(np.float64), expected, **TOL[dtype])


def check_twin(x, w, rel, dtype, y, view=metal_programs.OUTPUT_MAJOR):
    twin = run(x, w, rel, view, route=TWIN)
    np.testing.assert_allclose(y.astype(np.float64), twin.astype(np.float64), **TWIN_TOL[dtype])


# ------------------------------------------------------------------ selection
def ctx(direction="forward", **kw):
    base = dict(op="conv3d", map_kind="submanifold", dtype="float32", backend="metal",
                kernel_size=(3, 3, 3), tier="metal:test", direction=direction, tensor_ops=True)
    base.update(kw)
    return RouteContext(**base)


@pytest.mark.parametrize(
    "kw",
    [
        dict(c_in=7, c_out=13),
        dict(c_in=8, c_out=8, dtype="float16"),
        dict(c_in=3, c_out=8, map_kind="forward", kernel_size=(2, 2, 2)),
        dict(c_in=24, c_out=40, dtype="bfloat16", map_kind="target"),
        dict(dtype="float16", c_in=96, c_out=128, map_kind="generative"),
        dict(c_in=256, c_out=256, kernel_size=(5, 5, 5)),
        dict(c_in=1024, c_out=1024, dtype="float16", map_kind="transposed", kernel_size=(2, 2, 2)),
        dict(dtype="bfloat16", c_in=32, c_out=32, n_out=100000),
        dict(dtype="bfloat16", kernel_size=(1, 1, 1), map_kind="forward", c_in=64, c_out=64),
        dict(dtype="float16", c_in=48, c_out=64),  # no compile-time tile of the sorted seeds
        dict(direction="dgrad", kernel_size=None, k=27, c_in=64, c_out=32, dtype="bfloat16"),
        dict(direction="dgrad", kernel_size=None, k=27, c_in=48, c_out=40, n_out=100000),
        dict(direction="dgrad", kernel_size=None, k=8, c_in=16, c_out=12, n_out=1000),
        dict(c_in=40, c_out=16, dtype="bfloat16", n_out=100000),  # metal.cout16 has no bfloat16
    ],
)
def test_selected_on_tensorops(kw):
    assert routes.select(ctx(**kw)).route.name == ROUTE
    # the direct twin everywhere else
    assert routes.select(ctx(**{**kw, "tensor_ops": False})).route.name == TWIN


@pytest.mark.parametrize(
    "kw,route",
    [
        # the seed routes keep their predicates, and stay ahead where they apply
        (dict(kernel_size=(1, 1, 1), map_kind="forward", c_in=64, c_out=64), "metal.pointwise"),
        (dict(dtype="float16", c_in=64, c_out=64), "metal.tensorops_sorted"),
        (dict(dtype="float16", c_in=32, c_out=32, tensor_ops=False), "metal.sorted_gemm"),
        (dict(c_in=32, c_out=64, n_out=4096), "metal.dense_channel"),
        (dict(c_in=7, c_out=16, n_out=4096), "metal.cout16"),
        (dict(direction="dgrad", kernel_size=None, k=27, c_in=16, c_out=16, n_out=32768),
         "metal.tensorops_dgrad"),
        (dict(direction="dgrad", kernel_size=None, k=27, c_in=32, c_out=64, n_out=65536),
         "metal.dgrad_dense_grouped"),
        (dict(direction="dgrad", kernel_size=None, k=27, c_in=32, c_out=64, n_out=4096),
         "metal.dgrad_dense_channel"),
        # grouped and quantized products and weight gradients keep their routes
        (dict(c_in=16, c_out=16, groups=4), "metal.grouped_fetch_on_demand"),
        (dict(c_in=64, c_out=64, groups=2), "metal.grouped_csr_mma"),
        (dict(c_in=32, c_out=32, quantized=True, group_size=32), "metal.quantized_fetch_on_demand"),
        (dict(direction="wgrad", kernel_size=None, k=27, c_in=7, c_out=12), "metal.tensorops_wgrad_mma"),
    ],
)
def test_other_routes_kept(kw, route):
    assert routes.select(ctx(**kw)).route.name == route


def test_tiers():
    """The Mac plan's tiers: taken on M5 (Apple10, macOS 26.2), not on M3 /
    M4, and counted as matrix-unit work."""
    record = dict(op="conv3d", map_kind="submanifold", dtype="float16", kernel_size=[3, 3, 3],
                  k=27, direction="forward", c_in=96, c_out=96, n_in=5000, n_out=5000, edges=60000)
    assert routes.select(mac_plan.mac_context(record, "m5")).route.name == ROUTE
    for tier in ("m3", "m4"):
        assert routes.select(mac_plan.mac_context(record, tier)).route.name == TWIN
    p = mac_plan.plan([record], "m5")
    assert p["routes"][ROUTE]["kind"] == "matrix" and p["share"]["matrix"] == 1.0
    assert not diagnostics.metal_capabilities("applegpu_g17s", "26.1")["tensor_ops"]


def test_route_flags():
    r = routes.get(ROUTE)
    assert r.deterministic and r.matrix_unit and not r.grouped and r.passes == ("forward", "dgrad")
    assert r.kernel_file == "metal/tensorops_csr_mma.metal"
    assert r.table_file == "src/metal/tensorops_csr_mma.cpp"
    assert "metal.csr_mma" in r.summary and "direct twin" in r.summary
    # just above the twin, below every seed route
    assert routes.get(TWIN).priority < r.priority
    for name in ("metal.pointwise", "metal.sorted_gemm", "metal.tensorops_sorted", "metal.dense_channel",
                 "metal.cout16", "metal.tensorops_dgrad", "metal.dgrad_dense_grouped",
                 "metal.dgrad_dense_channel"):
        assert routes.get(name).priority > r.priority


# ------------------------------------------------------------------ program
@pytest.mark.parametrize("view", [metal_programs.OUTPUT_MAJOR, metal_programs.INPUT_MAJOR])
def test_program_is_the_twins_with_tensorops_kernels(rng, view):
    rel, rows_in, n_out, _ = relation(rng, "forward", 80)
    rows = rows_in if view == metal_programs.OUTPUT_MAJOR else n_out
    for c_out, bn in ((1, 16), (17, 32), (64, 64), (65, 128), (300, 128)):
        for dt, dtype in DTYPES.items():
            x, w = operands(rng, rows, 5, c_out, rel.kernel_volume, dtype)
            progs = []
            for route in (ROUTE, TWIN):
                inputs = _ext.conv_inputs(x, w, rel._native, view, route)
                out_rows = n_out if view == metal_programs.OUTPUT_MAJOR else rows_in
                progs.append(_ext.metal_program("conv", route, inputs, [out_rows, c_out], dtype))
            mine, twin = progs
            assert mine["temps"] == twin["temps"] == []
            (a,), (b,) = mine["steps"], twin["steps"]
            assert b["kernel"] == f"csr_mma_{dt}_n{bn}" and a["kernel"] == "tensorops_" + b["kernel"]
            assert tuple(a["groups"]) == tuple(b["groups"]) and tuple(a["threads"]) == (128, 1, 1)
            assert a["buffers"] == b["buffers"]


# ------------------------------------------------------------------ forward, every map kind
# (kind, ks, C_in, C_out, dtype, schedule): every kernel (dtype x column
# block), every map kind; channels not multiples of 8 or of the block.
FORWARD = [
    ("submanifold", 3, 8, 8, "float32", "forward"),
    ("forward", 3, 24, 40, "float16", "random"),
    ("target", 3, 40, 24, "bfloat16", "reverse"),
    ("transposed", 2, 96, 128, "float32", "random"),
    ("generative", 3, 128, 96, "float16", "forward"),
    ("submanifold", 3, 13, 7, "bfloat16", "random"),
    ("forward", 2, 40, 24, "float32", "reverse"),
    ("target", 3, 8, 8, "float16", "reverse"),
    ("generative", 3, 24, 40, "bfloat16", "forward"),
    ("transposed", 2, 24, 40, "float32", "forward"),
    ("submanifold", 3, 96, 128, "bfloat16", "random"),
    ("target", 3, 17, 30, "float16", "forward"),
    ("forward", 2, 8, 8, "bfloat16", "random"),
    ("submanifold", 3, 128, 96, "float32", "reverse"),
    ("generative", 3, 40, 8, "float32", "random"),
    ("transposed", 2, 8, 96, "float16", "reverse"),
]


@pytest.mark.parametrize("kind,ks,c_in,c_out,dt,schedule", FORWARD)
def test_forward(rng, kind, ks, c_in, c_out, dt, schedule):
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, kind, 150, ks)
    x, w = operands(rng, rows_in, c_in, c_out, rel.kernel_volume, dtype)
    y = run(x, w, rel, schedule=schedule, seed=c_in)
    check(y, reference(edges, x, w, n_out), dtype)
    check_twin(x, w, rel, dtype, y)


@pytest.mark.parametrize("ks,kind", [(1, "submanifold"), (2, "forward"), (3, "submanifold"), (5, "submanifold"),
                                     (5, "target")])
@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_kernel_volumes(rng, ks, kind, dt):
    """K = 1, 8, 27 and 125: the rounds visit each offset a row block has."""
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, kind, 120, ks)
    assert rel.kernel_volume == ks**3
    x, w = operands(rng, rows_in, 20, 12, rel.kernel_volume, dtype)
    y = run(x, w, rel, schedule="random", seed=ks)
    check(y, reference(edges, x, w, n_out), dtype)
    check_twin(x, w, rel, dtype, y)


# ------------------------------------------------------------------ input gradient
@pytest.mark.parametrize(
    "kind,ks,c_in,c_out,dt",
    [
        ("submanifold", 3, 24, 40, "float32"),
        ("forward", 2, 40, 24, "bfloat16"),
        ("target", 3, 8, 96, "float16"),
        ("transposed", 2, 33, 17, "bfloat16"),
        ("generative", 3, 16, 16, "float32"),
        ("submanifold", 5, 12, 20, "float16"),
        ("forward", 3, 128, 8, "float32"),
    ],
)
def test_input_gradient(rng, kind, ks, c_in, c_out, dt):
    """The input gradient: the same product over the input-major view with W
    transposed per offset, as autodiff builds it."""
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, kind, 150, ks)
    _, w = operands(rng, rows_in, c_in, c_out, rel.kernel_volume, dtype)
    ct = mx.array(rng.standard_normal((n_out, c_out)).astype(np.float32)).astype(dtype)
    wt = mx.swapaxes(w, 1, 2)
    view = metal_programs.INPUT_MAJOR
    dx = run(ct, wt, rel, view=view, schedule="random", seed=3)
    assert dx.shape == (rows_in, c_in)
    check(dx, reference(edges, ct, w, rows_in, transpose=True), dtype)
    check_twin(ct, wt, rel, dtype, dx, view)


# ------------------------------------------------------------------ edge cases
@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_pointwise_without_relation(rng, dt):
    """A 1x1x1 product with no relation reads row r for row r; 45 rows: a
    partial second tile."""
    dtype = DTYPES[dt]
    x, w = operands(rng, 45, 7, 33, 1, dtype)
    y = run(x, w, None, schedule="random")
    check(y, f64(x) @ f64(w)[0], dtype)
    check_twin(x, w, None, dtype, y)


def test_relation_without_edges_and_rows_without_edges(rng):
    coords = oracle.random_coords(rng, 30, 6, 1)
    x = ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32))
    m = x.manager
    far = np.array([[0, 90, 90, 90], [0, 95, 90, 90], [0, 99, 99, 99]], np.int32)
    rel = m.target_kernel_relation(x.coordinate_set, m.register(mx.array(far)), geometry(3, 1, 1))
    assert rel.edges == 0
    for dtype in DTYPES.values():
        feats, w = operands(rng, len(coords), 9, 20, 27, dtype)
        np.testing.assert_array_equal(run(feats, w, rel, schedule="reverse"), 0)
    # some rows with edges, some without, in one partial row block
    out = np.concatenate([far, coords[:7]]).astype(np.int32)
    rel = m.target_kernel_relation(x.coordinate_set, m.register(mx.array(out)), geometry(3, 1, 1))
    assert (np.diff(np.array(rel.out_offsets))[:3] == 0).all()
    y = run(feats, w, rel, schedule="random")
    np.testing.assert_array_equal(y[:3], 0)
    check(y, reference(oracle.conv_edges(coords, out, 3, 1, 1), feats, w, len(out)), mx.bfloat16)
    check_twin(feats, w, rel, mx.bfloat16, y)


def test_no_output_rows_and_no_input_channels(rng):
    rel, rows_in, n_out, _ = relation(rng, "submanifold", 40)
    coords = oracle.random_coords(rng, 20, 5, 1)
    x = ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32))
    m = x.manager
    empty = m.target_kernel_relation(x.coordinate_set, m.register(mx.zeros((0, 4), mx.int32)), geometry(3, 1, 1))
    feats, w = operands(rng, x.feats.shape[0], 8, 8, 27, mx.float32)
    assert run(feats, w, empty).shape == (0, 8)
    feats, w = operands(rng, rows_in, 0, 10, 27, mx.float16)
    np.testing.assert_array_equal(run(feats, w, rel, schedule="random"), 0)


def test_rows_take_their_edges_in_any_order(rng):
    """A CSR whose rows are not sorted by offset still sums every edge once."""
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 90)
    off = np.array(rel.out_offsets)
    gather, kidx = np.array(rel.in_idx).copy(), np.array(rel.k_idx).copy()
    for r in range(n_out):
        gather[off[r]:off[r + 1]] = gather[off[r]:off[r + 1]][::-1]
        kidx[off[r]:off[r + 1]] = kidx[off[r]:off[r + 1]][::-1]
    native = _ext.Relation("submanifold", rows_in, n_out, 27, mx.array(off), mx.array(gather), mx.array(kidx))
    x, w = operands(rng, rows_in, 16, 16, 27, mx.float32)
    y = run(x, w, native, schedule="random")
    check(y, reference(edges, x, w, n_out), mx.float32)
    check_twin(x, w, native, mx.float32, y)


# ------------------------------------------------------------------ determinism
@pytest.mark.parametrize("view", [metal_programs.OUTPUT_MAJOR, metal_programs.INPUT_MAJOR])
@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_same_bits_every_run(rng, dt, view):
    """Each output element is summed in one order: the same bits whatever
    order the threads and threadgroups run in."""
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 150)
    forward = view == metal_programs.OUTPUT_MAJOR
    # the input gradient's product: ct (n_out, 40) by (K, 40, 36) per offset
    x, w = operands(rng, rows_in if forward else n_out, 40, 36, 27, dtype)
    runs = [run(x, w, rel, view, schedule=s, seed=seed)
            for s, seed in (("forward", 0), ("reverse", 0), ("random", 1), ("random", 2))]
    for y in runs[1:]:
        assert y.tobytes() == runs[0].tobytes()
    if forward:
        check(runs[0], reference(edges, x, w, n_out), dtype)
    else:
        check(runs[0], reference(edges, x, mx.swapaxes(w, 1, 2), rows_in, transpose=True), dtype)


# ------------------------------------------------------------------ wide channels
@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_256_channels(rng, dt):
    """Two column blocks of 128 and 16 input-channel slices per round."""
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 70, extent=5, batches=1)
    x, w = operands(rng, rows_in, 256, 256, 27, dtype)
    y = run(x, w, rel, schedule="random")
    check(y, reference(edges, x, w, n_out), dtype)
    check_twin(x, w, rel, dtype, y)


def test_1024_channels(rng):
    """Eight column blocks and 64 slices per round."""
    rel, rows_in, n_out, edges = relation(rng, "forward", 80, ks=2, extent=6, batches=1)
    x, w = operands(rng, rows_in, 1024, 1024, 8, mx.float16)
    y = run(x, w, rel, schedule="random")
    check(y, reference(edges, x, w, n_out), mx.float16)
    check_twin(x, w, rel, mx.float16, y)


# ------------------------------------------------------------------ coverage
def test_this_file_runs_every_kernel_of_tensorops_csr_mma_metal():
    if BACKEND != "metal-harness":
        pytest.skip("lists kernels with the harness's source scanner")
    defined = {k for k, path in mh.defined_kernels().items() if path.name == "tensorops_csr_mma.metal"}
    assert defined == KERNELS
