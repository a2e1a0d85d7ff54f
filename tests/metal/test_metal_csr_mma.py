"""metal.csr_mma (metal/csr_mma.metal, src/metal/csr_mma.cpp): the
matrix-unit implicit GEMM over the CSR edges, forward and input gradient.

Selection: it takes every dense float product (float32, float16, bfloat16)
that no seed route takes, ahead of the scalar routes. Execution: its program
(_ext.metal_program on the primitive's own inputs) through the CPU harness,
or the GPU on a Mac, against sums over the oracle's edges (tests/oracle.py,
from coordinates alone) for every map kind, kernel volumes 1, 8, 27 and
125, channel counts that are and are not multiples of 8 and of the column
blocks, the three dtypes, empty relations and partial tiles; and the same
bits on every run, whatever the order threads run in.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlx_lattice as ml
from mlx_lattice import _ext, routes

import metal_programs
import mma_cases
import oracle
from metal_programs import relation
from mma_cases import DTYPES, TOL, f64, operands, reference

pytestmark = metal_programs.MARKS

ROUTE = "metal.csr_mma"
KERNELS = {f"csr_mma_{dt}_n{bn}" for dt in DTYPES for bn in (16, 32, 64, 128)}


def run(x, w, rel, view=metal_programs.OUTPUT_MAJOR, schedule="forward", seed=0):
    return mma_cases.conv(x, w, rel, view, schedule, seed, route=ROUTE)


def check(y, expected, dtype):
    mma_cases.check(y, expected, TOL[dtype])


# ------------------------------------------------------------------ selection
ctx = mma_cases.conv_ctx


@pytest.mark.parametrize(
    "kw,route",
    [
        # what the scalar routes took: the matrix units now
        (dict(c_in=7, c_out=13), ROUTE),  # was fp32_atomic
        (dict(c_in=3, c_out=8, map_kind="forward", kernel_size=(2, 2, 2)), ROUTE),  # was vec4
        (dict(dtype="float16", c_in=96, c_out=128), ROUTE),  # was fp16_gather
        (dict(c_in=256, c_out=256, kernel_size=(5, 5, 5)), ROUTE),
        (dict(dtype="float16", c_in=64, c_out=64, map_kind="generative"), ROUTE),
        # bfloat16: every dense product on Metal (the CPU before)
        (dict(dtype="bfloat16", c_in=32, c_out=32), ROUTE),
        (dict(dtype="bfloat16", c_in=32, c_out=32, n_out=100000), ROUTE),
        (dict(dtype="bfloat16", c_in=16, c_out=16, n_out=100000), ROUTE),
        (dict(dtype="bfloat16", kernel_size=(1, 1, 1), map_kind="forward", c_in=64, c_out=64), ROUTE),
        (dict(dtype="bfloat16", direction="dgrad", kernel_size=None, k=27, c_in=64, c_out=32), ROUTE),
        (dict(direction="dgrad", kernel_size=None, k=27, c_in=48, c_out=40, n_out=100000), ROUTE),
        # the seed routes stay ahead where they apply
        (dict(kernel_size=(1, 1, 1), map_kind="forward", c_in=64, c_out=64), "metal.pointwise"),
        (dict(dtype="float16", c_in=32, c_out=32), "metal.sorted_gemm"),
        (dict(dtype="float16", c_in=64, c_out=64, tensor_ops=True), "metal.tensorops_sorted"),
        (dict(c_in=32, c_out=64, n_out=4096), "metal.dense_channel"),
        (dict(c_in=7, c_out=16, n_out=4096), "metal.cout16"),
        (dict(direction="dgrad", kernel_size=None, k=27, c_in=16, c_out=16, n_out=32768,
              tensor_ops=True), "metal.tensorops_dgrad"),
        (dict(direction="dgrad", kernel_size=None, k=27, c_in=32, c_out=64, n_out=65536),
         "metal.dgrad_dense_grouped"),
        (dict(direction="dgrad", kernel_size=None, k=27, c_in=32, c_out=64, n_out=4096),
         "metal.dgrad_dense_channel"),
        (dict(direction="dgrad", kernel_size=None, k=27, c_in=24, c_out=16, n_out=5000), "metal.cout16"),
        # and what it does not serve: grouped, quantized, weight gradients
        (dict(c_in=16, c_out=16, groups=4), "metal.grouped_fetch_on_demand"),
        (dict(c_in=32, c_out=32, quantized=True, group_size=32), "metal.quantized_fetch_on_demand"),
        (dict(direction="wgrad", kernel_size=None, k=27, c_in=7, c_out=12), "metal.wgrad_mma"),
        # a bfloat16 product's weight gradient stays on the GPU too
        (dict(dtype="bfloat16", direction="wgrad", kernel_size=None, k=27, c_in=64, c_out=64),
         "metal.wgrad_mma"),
    ],
)
def test_selection(kw, route):
    assert routes.select(ctx(**kw)).route.name == route


def test_route_is_deterministic_and_serves_both_products():
    r = routes.get(ROUTE)
    assert r.deterministic and r.passes == ("forward", "dgrad") and r.backend == "metal"
    assert r.kernel_file == "metal/csr_mma.metal" and r.table_file == "src/metal/csr_mma.cpp"
    # ahead of every scalar route, behind every seed route
    for name in ("metal.vec4", "metal.fp16_gather", "metal.fp32_atomic", "metal.fetch_on_demand"):
        assert routes.get(name).priority < r.priority
    for name in ("metal.pointwise", "metal.sorted_gemm", "metal.tensorops_sorted", "metal.dense_channel",
                 "metal.cout16", "metal.tensorops_dgrad", "metal.dgrad_dense_grouped",
                 "metal.dgrad_dense_channel"):
        assert routes.get(name).priority > r.priority


# ------------------------------------------------------------------ program
@pytest.mark.parametrize("c_out,bn", [(1, 16), (16, 16), (17, 32), (32, 32), (40, 64), (64, 64),
                                      (65, 128), (128, 128), (300, 128)])
def test_program_shapes_and_bindings(rng, c_out, bn):
    rel, rows_in, n_out, _ = relation(rng, "submanifold", 60)
    for dt, dtype in DTYPES.items():
        x, w = operands(rng, rows_in, 5, c_out, 27, dtype)
        inputs = _ext.conv_inputs(x, w, rel._native, metal_programs.OUTPUT_MAJOR, ROUTE)
        prog = _ext.metal_program("conv", ROUTE, inputs, [n_out, c_out], dtype)
        assert prog["temps"] == []
        (step,) = prog["steps"]
        assert step["kernel"] == f"csr_mma_{dt}_n{bn}"
        # 32 rows x BN channels per group of 4 simdgroups; column blocks fastest
        assert tuple(step["threads"]) == (128, 1, 1)
        assert tuple(step["groups"]) == (-(-c_out // bn), -(-n_out // 32), 1)
        assert [nm for _, _, nm in step["buffers"]] == [
            "x", "w", "offsets", "gather", "k", "row_order", "y", "params"]
        assert step["buffers"][5][:2] == ("input", 5)
        params = np.frombuffer(step["buffers"][-1][1], np.int32).tolist()
        assert params == [n_out, 5, c_out, 5, c_out, -1]  # GroupedParams, one group


# ------------------------------------------------------------------ forward, every map kind
FORWARD = mma_cases.FORWARD


@pytest.mark.parametrize("kind,ks,c_in,c_out,dt,schedule", FORWARD)
def test_forward(rng, kind, ks, c_in, c_out, dt, schedule):
    dtype = DTYPES[dt]
    x, w, rel, y, expected = mma_cases.conv_case(rng, run, kind, ks, c_in, c_out, dtype, schedule=schedule, seed=c_in)
    check(y, expected, dtype)


@pytest.mark.parametrize("ks,kind", [(1, "submanifold"), (2, "forward"), (3, "submanifold"), (5, "submanifold"),
                                     (5, "target")])
@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_kernel_volumes(rng, ks, kind, dt):
    """K = 1, 8, 27 and 125: the rounds visit each offset a row block has."""
    dtype = DTYPES[dt]
    x, w, rel, y, expected = mma_cases.conv_case(rng, run, kind, ks, 20, 12, dtype, n=120, schedule="random", seed=ks)
    assert rel.kernel_volume == ks**3
    check(y, expected, dtype)


# ------------------------------------------------------------------ input gradient
@pytest.mark.parametrize("kind,ks,c_in,c_out,dt", mma_cases.INPUT_GRADIENT)
def test_input_gradient(rng, kind, ks, c_in, c_out, dt):
    """The input gradient is the same product over the input-major view with
    W transposed per offset, as autodiff builds it (src/core/primitives.cpp)."""
    dtype = DTYPES[dt]
    ct, wt, rel, dx, expected = mma_cases.dgrad_case(rng, run, kind, ks, c_in, c_out, dtype, schedule="random", seed=3)
    check(dx, expected, dtype)


# ------------------------------------------------------------------ edge cases
@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_pointwise_without_relation(rng, dt):
    """A 1x1x1 product with no relation reads row r for row r."""
    dtype = DTYPES[dt]
    x, w = operands(rng, 45, 7, 33, 1, dtype)
    y = run(x, w, None, schedule="random")
    check(y, f64(x) @ f64(w)[0], dtype)


def test_relation_without_edges_and_rows_without_edges(rng):
    coords, x, rel = mma_cases.edgeless(rng, 30)
    feats, w = operands(rng, len(coords), 9, 20, 27, mx.float16)
    np.testing.assert_array_equal(run(feats, w, rel, schedule="reverse"), 0)
    # some rows with edges, some without, in one row block
    out = np.concatenate([mma_cases.FAR, coords[:7]]).astype(np.int32)
    rel = mma_cases.target_relation(x, out)
    assert (np.diff(np.array(rel.out_offsets))[:3] == 0).all()
    y = run(feats, w, rel, schedule="random")
    np.testing.assert_array_equal(y[:3], 0)
    check(y, reference(oracle.conv_edges(coords, out, 3, 1, 1), feats, w, len(out)), mx.float16)


def test_no_output_rows_and_no_input_channels(rng):
    rel, rows_in, n_out, _ = relation(rng, "submanifold", 40)
    # no output rows: a target support of nothing
    x = ml.SparseTensor(oracle.random_coords(rng, 20, 5, 1), np.zeros((20, 1), np.float32))
    empty = mma_cases.target_relation(x, mx.zeros((0, 4), mx.int32))
    feats, w = operands(rng, x.feats.shape[0], 8, 8, 27, mx.float32)
    assert run(feats, w, empty).shape == (0, 8)
    # no input channels: every sum is empty
    feats, w = operands(rng, rows_in, 0, 10, 27, mx.bfloat16)
    np.testing.assert_array_equal(run(feats, w, rel, schedule="random"), 0)


def test_rows_take_their_edges_in_any_order(rng):
    """Rounds take each row's pending edge with the smallest offset among the
    row block, so a CSR whose rows are not sorted by offset (a relation made
    from arrays) still sums every edge once."""
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 90)
    native = mma_cases.reversed_rows(rel, rows_in, n_out)
    x, w = operands(rng, rows_in, 16, 16, 27, mx.float32)
    y = metal_programs.conv(ROUTE, x, w, native, schedule="random")
    check(y, reference(edges, x, w, n_out), mx.float32)


# ------------------------------------------------------------------ determinism
@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_same_bits_every_run(rng, dt):
    """Each output element is summed in one order: the same bits whatever
    order the threads and threadgroups run in."""
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 150)
    x, w = operands(rng, rows_in, 40, 36, 27, dtype)
    y = mma_cases.same_bits(lambda s, seed: run(x, w, rel, schedule=s, seed=seed))
    check(y, reference(edges, x, w, n_out), dtype)


def test_float32_agrees_with_the_cpu_route(rng):
    rel, rows_in, n_out, edges = relation(rng, "forward", 150)
    x, w = operands(rng, rows_in, 33, 47, 27, mx.float32)
    y = run(x, w, rel)
    cpu = _ext.gather_conv(x, w, rel._native, metal_programs.OUTPUT_MAJOR, "cpu.gather_gemm",
                           stream=mx.default_stream(mx.cpu))
    np.testing.assert_allclose(y, np.array(cpu), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ wide channels
@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_256_channels(rng, dt):
    """Several column blocks of 128 and 16 input-channel slices per round."""
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 70, extent=5, batches=1)
    x, w = operands(rng, rows_in, 256, 256, 27, dtype)
    y = run(x, w, rel, schedule="random")
    check(y, reference(edges, x, w, n_out), dtype)


def test_1024_channels(rng):
    """Eight column blocks and 64 slices per round (about 5 s in the harness)."""
    rel, rows_in, n_out, edges = relation(rng, "forward", 80, ks=2, extent=6, batches=1)
    x, w = operands(rng, rows_in, 1024, 1024, 8, mx.float16)
    y = run(x, w, rel, schedule="random")
    check(y, reference(edges, x, w, n_out), mx.float16)


# ------------------------------------------------------------------ coverage
def test_this_file_runs_every_kernel_of_csr_mma_metal():
    assert mma_cases.kernels_of("csr_mma.metal") == KERNELS
