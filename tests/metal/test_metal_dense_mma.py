"""The seed routes on simdgroup matrices: metal.dense_channel,
metal.dgrad_dense_channel and metal.dgrad_dense_grouped (dense_mma in
metal/forward_dense.metal), metal.pointwise (pointwise_mma, same file) and
metal.cout16 (the csr_mma kernels at their 16-channel block).

Their predicates are the seed's (checked here against the texts they had);
their programs run through the CPU harness (or the GPU on a Mac) against
float64 sums over the oracle's edges (tests/oracle.py), float32 and float16,
every pass each route serves, channel counts the predicates admit including
partial tiles, rows without edges, empty inputs; and the same bits whatever
order threads run in.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_lattice import _ext, routes

import metal_programs
import mma_cases
from metal_programs import INPUT_MAJOR, OUTPUT_MAJOR, relation
from mma_cases import SCHEDULES, TOL, f64, operands, reference

pytestmark = metal_programs.MARKS
BACKEND = metal_programs.BACKEND

DTYPES = {"float32": mx.float32, "float16": mx.float16}


def check(y, expected, dtype):
    mma_cases.check(y, expected, TOL[dtype])

PAIRS = [(a, b) for a in (16, 32, 64) for b in (16, 32, 64)]

# The seed's predicates, passes and priorities: the kernels moved, these did not.
SEED = {
    "metal.dense_channel": (80, ("forward",),
                            "dense (unquantized) weight and 5D dense weight and C_in and C_out in {16, 32, 64} "
                            "and K >= 16 and output capacity >= 4096 and features float32 or float16"),
    "metal.dgrad_dense_channel": (84, ("dgrad",),
                                  "dense (unquantized) weight and 5D dense weight and C_in and C_out in "
                                  "{16, 32, 64} and input capacity >= 4096 and features float32 or float16"),
    "metal.dgrad_dense_grouped": (86, ("dgrad",),
                                  "dense (unquantized) weight and 5D dense weight and C_in and C_out in "
                                  "{16, 32, 64} and input capacity >= 65536 and features float32 or float16"),
    "metal.pointwise": (100, ("forward", "dgrad"),
                        "dense (unquantized) weight and kernel 1x1x1 and stride 1 and no padding/dilation "
                        "and no explicit target support and map kind forward or submanifold and features float32 or "
                        "float16"),
    "metal.cout16": (70, ("forward", "dgrad"),
                     "dense (unquantized) weight and C_out == 16 and (K >= 16 and output capacity >= 4096, "
                     "or output capacity >= 50000) and features float32 or float16"),
}


@pytest.mark.parametrize("name", sorted(SEED))
def test_seed_predicates_kept_and_marked_matrix_unit(name):
    r = routes.get(name)
    priority, passes, predicate = SEED[name]
    assert (r.priority, r.passes, r.predicate) == (priority, passes, predicate)
    assert r.matrix_unit and r.deterministic and r.backend == "metal"


def test_kernel_files():
    for name in ("metal.dense_channel", "metal.dgrad_dense_channel", "metal.dgrad_dense_grouped",
                 "metal.pointwise"):
        r = routes.get(name)
        assert r.kernel_file == "metal/forward_dense.metal" and r.table_file == "src/metal/forward_dense.cpp"
    r = routes.get("metal.cout16")
    assert r.kernel_file == "metal/csr_mma.metal" and r.table_file == "src/metal/csr_mma.cpp"


# ------------------------------------------------------------------ programs
def program(route, x, w, rel, view, shape):
    inputs = _ext.conv_inputs(x, w, None if rel is None else rel._native, view, route)
    return _ext.metal_program("conv", route, inputs, shape, x.dtype)


@pytest.mark.parametrize("route,view,rows_per_group", [
    ("metal.dense_channel", OUTPUT_MAJOR, 32),
    ("metal.dgrad_dense_channel", INPUT_MAJOR, 32),
    ("metal.dgrad_dense_grouped", INPUT_MAJOR, 64),
])
def test_dense_program_shapes_and_bindings(rng, route, view, rows_per_group):
    rel, rows_in, n_out, _ = relation(rng, "forward", 120)
    rows = n_out if view == OUTPUT_MAJOR else rows_in
    x, w = operands(rng, n_out if view == INPUT_MAJOR else rows_in, 32, 64, 27, mx.float16)
    (step,) = program(route, x, w, rel, view, [rows, 64])["steps"]
    stem = "dgrad_dense_grouped" if route.endswith("grouped") else "dense_channel"
    assert step["kernel"] == f"{stem}_float16_32x64"
    assert tuple(step["threads"]) == (128, 1, 1)
    assert tuple(step["groups"]) == (-(-rows // rows_per_group), 1, 1)
    map_name = "neighbor_map" if view == OUTPUT_MAJOR else "input_neighbor_map"
    assert [nm for _, _, nm in step["buffers"]] == ["x", "w", map_name, "row_order", "y", "params"]


@pytest.mark.parametrize("c_out,bn", [(1, 16), (16, 16), (17, 32), (32, 32), (33, 64), (64, 64), (200, 64)])
def test_pointwise_program_shapes_and_bindings(rng, c_out, bn):
    x, w = operands(rng, 130, 5, c_out, 1, mx.float32)
    (step,) = program("metal.pointwise", x, w, None, OUTPUT_MAJOR, [130, c_out])["steps"]
    assert step["kernel"] == f"pointwise_float32_n{bn}"
    assert tuple(step["threads"]) == (128, 1, 1)
    assert tuple(step["groups"]) == (-(-c_out // bn), 3, 1)
    assert [nm for _, _, nm in step["buffers"]] == ["x", "w", "y", "params"]


def test_cout16_program_is_the_csr_mma_16_channel_block(rng):
    rel, rows_in, n_out, _ = relation(rng, "submanifold", 60)
    x, w = operands(rng, rows_in, 5, 16, 27, mx.float16)
    (step,) = program("metal.cout16", x, w, rel, OUTPUT_MAJOR, [n_out, 16])["steps"]
    (ref,) = program("metal.csr_mma", x, w, rel, OUTPUT_MAJOR, [n_out, 16])["steps"]
    assert step["kernel"] == "csr_mma_float16_n16" and step == ref
    x, w = operands(rng, rows_in, 5, 12, 27, mx.float16)
    with pytest.raises(ValueError, match="cout16"):
        program("metal.cout16", x, w, rel, OUTPUT_MAJOR, [n_out, 12])


# ------------------------------------------------------------------ dense channels
def dense(route, rng, kind, ks, c_in, c_out, dt, schedule="random", seed=0, n=150):
    """Forward (dense_channel) or input gradient (the dgrad routes) of one
    relation through `route`, against the oracle's sums."""
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, kind, n, ks)
    k = rel.kernel_volume
    if route == "metal.dense_channel":
        x, w = operands(rng, rows_in, c_in, c_out, k, dtype)
        y = metal_programs.conv(route, x, w, rel._native, OUTPUT_MAJOR, schedule=schedule, seed=seed)
        return y, reference(edges, x, w, n_out)
    # the product's channels: c_in -> c_out over the input-major view, the
    # convolution's weight (K, c_out, c_in) transposed per offset
    _, w = operands(rng, rows_in, c_out, c_in, k, dtype)
    ct = mx.array(rng.standard_normal((n_out, c_in)).astype(np.float32)).astype(dtype)
    dx = metal_programs.conv(route, ct, mx.swapaxes(w, 1, 2), rel._native, INPUT_MAJOR, schedule=schedule,
                             seed=seed)
    assert dx.shape == (rows_in, c_out)
    return dx, reference(edges, ct, w, rows_in, transpose=True)


@pytest.mark.parametrize("c_in,c_out", PAIRS)
@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_dense_channel_every_instantiation(rng, c_in, c_out, dt):
    kind = ("submanifold", "forward", "target", "transposed", "generative")[(c_in // 16 + c_out // 16) % 5]
    ks = 2 if kind == "transposed" else 3
    y, expected = dense("metal.dense_channel", rng, kind, ks, c_in, c_out, dt, seed=c_in + c_out)
    check(y, expected, DTYPES[dt])


@pytest.mark.parametrize("route", ["metal.dgrad_dense_channel", "metal.dgrad_dense_grouped"])
@pytest.mark.parametrize("kind,ks,c_in,c_out,dt", [
    ("submanifold", 3, 16, 64, "float32"),
    ("forward", 2, 64, 16, "float16"),      # K = 8: the input gradient has no K condition
    ("target", 3, 64, 64, "float32"),       # input rows without edges
    ("transposed", 2, 32, 16, "float16"),
    ("generative", 3, 16, 32, "float32"),
    ("submanifold", 5, 32, 64, "float16"),  # K = 125
])
def test_input_gradient(rng, route, kind, ks, c_in, c_out, dt):
    y, expected = dense(route, rng, kind, ks, c_in, c_out, dt, seed=ks)
    check(y, expected, DTYPES[dt])


@pytest.mark.parametrize("ks,kind", [(3, "target"), (5, "submanifold")])
def test_dense_channel_kernel_volumes(rng, ks, kind):
    y, expected = dense("metal.dense_channel", rng, kind, ks, 32, 16, "float16", n=200)
    check(y, expected, mx.float16)


def test_dense_routes_with_no_edges_and_no_rows(rng):
    coords, x, rel = mma_cases.edgeless(rng, 40)
    for dt, dtype in DTYPES.items():
        feats, w = operands(rng, len(coords), 16, 32, 27, dtype)
        y = metal_programs.conv("metal.dense_channel", feats, w, rel._native, schedule="reverse")
        np.testing.assert_array_equal(y, np.zeros((3, 32)))
        ct, wt = operands(rng, 3, 32, 16, 27, dtype)
        for route in ("metal.dgrad_dense_channel", "metal.dgrad_dense_grouped"):
            dx = metal_programs.conv(route, ct, wt, rel._native, INPUT_MAJOR, schedule="random")
            np.testing.assert_array_equal(dx, np.zeros((len(coords), 16)))
    # no output rows
    empty = mma_cases.target_relation(x, mx.zeros((0, 4), mx.int32))
    feats, w = operands(rng, len(coords), 64, 16, 27, mx.float32)
    assert metal_programs.conv("metal.dense_channel", feats, w, empty._native).shape == (0, 16)


# ------------------------------------------------------------------ pointwise
@pytest.mark.parametrize("rows,c_in,c_out", [(45, 7, 1), (130, 16, 16), (64, 33, 24), (100, 64, 40),
                                             (70, 70, 64), (129, 5, 130)])
@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_pointwise(rng, rows, c_in, c_out, dt):
    """Every column block (16, 32, 64; C_out 130 takes three), input
    channels past the 32-channel slices, rows past the 64-row tiles."""
    dtype = DTYPES[dt]
    x, w = operands(rng, rows, c_in, c_out, 1, dtype)
    y = metal_programs.conv("metal.pointwise", x, w, None, schedule="random", seed=rows)
    check(y, f64(x) @ f64(w)[0], dtype)


@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_pointwise_input_gradient(rng, dt):
    """The input gradient of a 1x1x1 product: ct @ W[0]^T, the same kernels."""
    dtype = DTYPES[dt]
    ct, w = operands(rng, 90, 24, 40, 1, dtype)  # W (1, C_in 40, C_out 24) of the convolution, transposed
    dx = metal_programs.conv("metal.pointwise", ct, w, None, INPUT_MAJOR, schedule="reverse")
    check(dx, f64(ct) @ f64(w)[0], dtype)


def test_pointwise_empty(rng):
    x, w = operands(rng, 0, 8, 24, 1, mx.float32)
    assert metal_programs.conv("metal.pointwise", x, w, None).shape == (0, 24)
    x, w = operands(rng, 20, 0, 24, 1, mx.float16)  # no input channels: every sum empty
    np.testing.assert_array_equal(metal_programs.conv("metal.pointwise", x, w, None, schedule="random"), 0)


# ------------------------------------------------------------------ cout16
@pytest.mark.parametrize("kind,ks,c_in,dt,view", [
    ("submanifold", 3, 5, "float32", OUTPUT_MAJOR),
    ("forward", 2, 13, "float16", OUTPUT_MAJOR),
    ("target", 3, 40, "float32", OUTPUT_MAJOR),
    ("submanifold", 3, 24, "float16", INPUT_MAJOR),
    ("transposed", 2, 7, "float32", INPUT_MAJOR),
])
def test_cout16(rng, kind, ks, c_in, dt, view):
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, kind, 150, ks)
    k = rel.kernel_volume
    if view == OUTPUT_MAJOR:
        x, w = operands(rng, rows_in, c_in, 16, k, dtype)
        y = metal_programs.conv("metal.cout16", x, w, rel._native, schedule="random", seed=c_in)
        check(y, reference(edges, x, w, n_out), dtype)
    else:  # input gradient: the convolution's C_in is 16
        _, w = operands(rng, rows_in, 16, c_in, k, dtype)
        ct = mx.array(rng.standard_normal((n_out, c_in)).astype(np.float32)).astype(dtype)
        dx = metal_programs.conv("metal.cout16", ct, mx.swapaxes(w, 1, 2), rel._native, INPUT_MAJOR,
                                 schedule="random", seed=c_in)
        check(dx, reference(edges, ct, w, rows_in, transpose=True), dtype)


# ------------------------------------------------------------------ determinism


@pytest.mark.parametrize("route,dt", [("metal.dense_channel", "float32"), ("metal.dgrad_dense_grouped", "float16"),
                                      ("metal.dgrad_dense_channel", "float32")])
def test_dense_same_bits_every_run(route, dt):
    runs = [dense(route, np.random.default_rng(7), "forward", 3, 64, 32, dt, schedule=s, seed=seed)
            for s, seed in SCHEDULES]
    for y, _ in runs[1:]:
        assert y.tobytes() == runs[0][0].tobytes()
    check(runs[0][0], runs[0][1], DTYPES[dt])


@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_pointwise_and_cout16_same_bits_every_run(rng, dt):
    dtype = DTYPES[dt]
    x, w = operands(rng, 100, 40, 70, 1, dtype)
    runs = [metal_programs.conv("metal.pointwise", x, w, None, schedule=s, seed=seed) for s, seed in SCHEDULES]
    assert all(y.tobytes() == runs[0].tobytes() for y in runs[1:])
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 120)
    x, w = operands(rng, rows_in, 20, 16, 27, dtype)
    runs = [metal_programs.conv("metal.cout16", x, w, rel._native, schedule=s, seed=seed) for s, seed in SCHEDULES]
    assert all(y.tobytes() == runs[0].tobytes() for y in runs[1:])
    check(runs[0], reference(edges, x, w, n_out), dtype)


# ------------------------------------------------------------------ coverage
def test_forward_dense_metal_holds_only_these_kernels():
    defined = mma_cases.kernels_of("forward_dense.metal")
    expected = {f"{stem}_{dt}_{a}x{b}" for stem in ("dense_channel", "dgrad_dense_grouped") for dt in DTYPES
                for a, b in PAIRS}
    expected |= {f"pointwise_{dt}_n{bn}" for dt in DTYPES for bn in (16, 32, 64)}
    assert defined == expected
