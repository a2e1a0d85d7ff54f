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

from mlx_lattice import _ext, routes

import metal_programs
import mma_cases
import oracle
from metal_programs import relation
from mma_cases import DTYPES, TOL, f64, operands, reference

pytestmark = metal_programs.MARKS

ROUTE = "metal.tensorops_csr_mma"
TWIN = "metal.csr_mma"
# Against the twin: the same float products summed in another order within
# a slice, so at most one rounding step of the dtype apart (float32: the
# float sums' own error, up to a few ulps of their terms, where they cancel).
TWIN_TOL = {
    mx.float32: dict(rtol=1e-5, atol=1e-5),
    mx.float16: dict(rtol=2.0**-10, atol=2.0**-14),
    mx.bfloat16: dict(rtol=2.0**-7, atol=2.0**-14),
}
KERNELS = {f"tensorops_csr_mma_{dt}_n{bn}" for dt in DTYPES for bn in (16, 32, 64, 128)}


def run(x, w, rel, view=metal_programs.OUTPUT_MAJOR, schedule="forward", seed=0, route=ROUTE):
    return mma_cases.conv(x, w, rel, view, schedule, seed, route=route)


def check(y, expected, dtype):
    mma_cases.check(y, expected, TOL[dtype])


def check_twin(x, w, rel, dtype, y, view=metal_programs.OUTPUT_MAJOR):
    twin = run(x, w, rel, view, route=TWIN)
    np.testing.assert_allclose(y.astype(np.float64), twin.astype(np.float64), **TWIN_TOL[dtype])


# ------------------------------------------------------------------ selection
def ctx(direction="forward", **kw):
    return mma_cases.conv_ctx(direction, **{"tensor_ops": True, **kw})


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
    mma_cases.assert_tensorops_tiers(record, ROUTE, TWIN)


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
FORWARD = mma_cases.FORWARD + [
    ("generative", 3, 40, 8, "float32", "random"),
    ("transposed", 2, 8, 96, "float16", "reverse"),
]


@pytest.mark.parametrize("kind,ks,c_in,c_out,dt,schedule", FORWARD)
def test_forward(rng, kind, ks, c_in, c_out, dt, schedule):
    dtype = DTYPES[dt]
    x, w, rel, y, expected = mma_cases.conv_case(rng, run, kind, ks, c_in, c_out, dtype, schedule=schedule, seed=c_in)
    check(y, expected, dtype)
    check_twin(x, w, rel, dtype, y)


@pytest.mark.parametrize("ks,kind", [(1, "submanifold"), (2, "forward"), (3, "submanifold"), (5, "submanifold"),
                                     (5, "target")])
@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_kernel_volumes(rng, ks, kind, dt):
    """K = 1, 8, 27 and 125: the rounds visit each offset a row block has."""
    dtype = DTYPES[dt]
    x, w, rel, y, expected = mma_cases.conv_case(rng, run, kind, ks, 20, 12, dtype, n=120, schedule="random", seed=ks)
    assert rel.kernel_volume == ks**3
    check(y, expected, dtype)
    check_twin(x, w, rel, dtype, y)


# ------------------------------------------------------------------ input gradient
@pytest.mark.parametrize("kind,ks,c_in,c_out,dt",
                         mma_cases.INPUT_GRADIENT + [("forward", 3, 128, 8, "float32")])
def test_input_gradient(rng, kind, ks, c_in, c_out, dt):
    """The input gradient: the same product over the input-major view with W
    transposed per offset, as autodiff builds it."""
    dtype = DTYPES[dt]
    ct, wt, rel, dx, expected = mma_cases.dgrad_case(rng, run, kind, ks, c_in, c_out, dtype, schedule="random", seed=3)
    check(dx, expected, dtype)
    check_twin(ct, wt, rel, dtype, dx, metal_programs.INPUT_MAJOR)


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
    coords, x, rel = mma_cases.edgeless(rng, 30)
    for dtype in DTYPES.values():
        feats, w = operands(rng, len(coords), 9, 20, 27, dtype)
        np.testing.assert_array_equal(run(feats, w, rel, schedule="reverse"), 0)
    # some rows with edges, some without, in one partial row block
    out = np.concatenate([mma_cases.FAR, coords[:7]]).astype(np.int32)
    rel = mma_cases.target_relation(x, out)
    assert (np.diff(np.array(rel.out_offsets))[:3] == 0).all()
    y = run(feats, w, rel, schedule="random")
    np.testing.assert_array_equal(y[:3], 0)
    check(y, reference(oracle.conv_edges(coords, out, 3, 1, 1), feats, w, len(out)), mx.bfloat16)
    check_twin(feats, w, rel, mx.bfloat16, y)


def test_no_output_rows_and_no_input_channels(rng):
    rel, rows_in, n_out, _ = relation(rng, "submanifold", 40)
    _, x = mma_cases.tensor(rng, 20, 5)
    empty = mma_cases.target_relation(x, mx.zeros((0, 4), mx.int32))
    feats, w = operands(rng, x.feats.shape[0], 8, 8, 27, mx.float32)
    assert run(feats, w, empty).shape == (0, 8)
    feats, w = operands(rng, rows_in, 0, 10, 27, mx.float16)
    np.testing.assert_array_equal(run(feats, w, rel, schedule="random"), 0)


def test_rows_take_their_edges_in_any_order(rng):
    """A CSR whose rows are not sorted by offset still sums every edge once."""
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 90)
    native = mma_cases.reversed_rows(rel, rows_in, n_out)
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
    y = mma_cases.same_bits(lambda s, seed: run(x, w, rel, view, schedule=s, seed=seed))
    if forward:
        check(y, reference(edges, x, w, n_out), dtype)
    else:
        check(y, reference(edges, x, mx.swapaxes(w, 1, 2), rows_in, transpose=True), dtype)


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
    assert mma_cases.kernels_of("tensorops_csr_mma.metal") == KERNELS
