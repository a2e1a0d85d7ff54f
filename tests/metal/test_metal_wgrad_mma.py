"""metal.wgrad_mma (metal/wgrad_mma.metal, src/metal/wgrad_mma.cpp): the
matrix-unit weight gradient over the kernel-major edges, partitioned per
offset and reduced in order (wgrad_reduce, metal/backward.metal).

Selection: every dense weight gradient (float32, float16, bfloat16) but the
TensorOps contraction's, ahead of the scalar wgrad_* routes. Execution: the
route's program through the CPU harness (the GPU on a Mac) against sums over
the oracle's edges for every map kind, kernel volumes 1, 8, 27 and 125,
channels that are and are not multiples of 8 and of the blocks, the three
dtypes, one and several partitions, empty relations; the same bits on every
run.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_lattice import routes

import metal_programs
import mma_cases
from metal_programs import relation
from mma_cases import DTYPES, f64
from mma_cases import WTOL as TOL
from mma_cases import wgrad_operands as operands
from mma_cases import wgrad_reference as reference

pytestmark = metal_programs.MARKS

ROUTE = "metal.wgrad_mma"
KERNELS = {f"wgrad_mma_{dt}_n{bn}" for dt in DTYPES for bn in (32, 64)}


def program(x, ct, native, k, dtype):
    return mma_cases.wgrad_program(ROUTE, x, ct, native, k, dtype)


def run(x, ct, rel, k, schedule="forward", seed=0):
    return mma_cases.wgrad(x, ct, rel, k, schedule, seed, route=ROUTE)


def check(dw, expected, dtype):
    mma_cases.check(dw, expected, TOL[dtype], "weights")


# ------------------------------------------------------------------ selection
ctx = mma_cases.wgrad_ctx


@pytest.mark.parametrize(
    "kw,route",
    [
        (dict(c_in=7, c_out=12), ROUTE),  # was wgrad_direct
        (dict(c_in=8, c_out=12), ROUTE),  # was wgrad_block4
        (dict(c_in=7, c_out=16, dtype="float16"), ROUTE),  # was wgrad_cout16
        (dict(c_in=32, c_out=32, edges=4096), ROUTE),  # was wgrad_dense_square
        (dict(c_in=40, c_out=33, dtype="float16"), ROUTE),  # was wgrad_fp16
        (dict(c_in=64, c_out=64, dtype="bfloat16", n_in=100000), ROUTE),  # the CPU before
        (dict(c_in=256, c_out=128, k=125), ROUTE),
        # the TensorOps contraction stays ahead where it applies
        (dict(c_in=32, c_out=64, n_in=32768, tensor_ops=True), "metal.tensorops_wgrad"),
        # its TensorOps twin elsewhere on a TensorOps tier
        (dict(c_in=48, c_out=64, n_in=32768, tensor_ops=True), "metal.tensorops_wgrad_mma"),
        # grouped products keep their route
        (dict(c_in=16, c_out=16, groups=4), "metal.grouped_wgrad"),
    ],
)
def test_selection(kw, route):
    assert routes.select(ctx(**kw)).route.name == route


def test_route_flags():
    r = routes.get(ROUTE)
    assert r.deterministic and r.passes == ("wgrad",) and r.table_file == "src/metal/wgrad_mma.cpp"
    assert routes.get("metal.tensorops_wgrad").priority > r.priority
    for name in ("metal.wgrad_dense_square", "metal.wgrad_cout16", "metal.wgrad_block4", "metal.wgrad_fp16",
                 "metal.wgrad_direct"):
        assert routes.get(name).priority < r.priority


# ------------------------------------------------------------------ program
def test_program_partitions_by_edges_per_offset(rng):
    rel, rows_in, n_out, _ = relation(rng, "submanifold", 60)
    x, ct = operands(rng, rows_in, n_out, 5, 40, mx.float16)
    prog = program(x, ct, rel._native, 27, mx.float16)
    # a few edges per offset: one partition, dW written directly
    (step,) = prog["steps"]
    assert step["kernel"] == "wgrad_mma_float16_n64"
    assert tuple(step["groups"]) == (1, 1, 27) and tuple(step["threads"]) == (128, 1, 1)
    assert [nm for _, _, nm in step["buffers"]] == ["x", "ct", "offsets", "g", "r", "partials", "dw", "params"]
    assert np.frombuffer(step["buffers"][-1][1], np.int32).tolist() == [27, 5, 40, 1, -1, 1]
    assert prog["temps"] == [("float32", 1)]
    # 3000 rows of a 1x1x1 product: 6 partitions of about 512 edges, then
    # their ordered sum
    x, ct = operands(rng, 3000, 3000, 70, 20, mx.bfloat16)
    prog = program(x, ct, None, 1, mx.bfloat16)
    first, reduce = prog["steps"]
    assert first["kernel"] == "wgrad_mma_bfloat16_n32" and tuple(first["groups"]) == (3, 6, 1)
    assert np.frombuffer(first["buffers"][-1][1], np.int32).tolist() == [1, 70, 20, 6, 3000, 1]
    assert prog["temps"] == [("float32", 6 * 70 * 20)]
    assert reduce["kernel"] == "wgrad_reduce_bfloat16"
    assert [nm for _, _, nm in reduce["buffers"]] == ["partials", "dw", "params"]
    assert np.frombuffer(reduce["buffers"][-1][1], np.int32).tolist() == [1, 70, 20, 6]


# ------------------------------------------------------------------ every map kind
CASES = mma_cases.WEIGHT_GRADIENT


@pytest.mark.parametrize("kind,ks,c_in,c_out,dt,schedule", CASES)
def test_weight_gradient(rng, kind, ks, c_in, c_out, dt, schedule):
    dtype = DTYPES[dt]
    x, ct, rel, dw, expected = mma_cases.wgrad_case(rng, run, kind, ks, c_in, c_out, dtype, schedule=schedule,
                                                    seed=c_in)
    check(dw, expected, dtype)


@pytest.mark.parametrize("ks,kind", [(1, "submanifold"), (2, "forward"), (5, "submanifold")])
@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_kernel_volumes(rng, ks, kind, dt):
    dtype = DTYPES[dt]
    x, ct, rel, dw, expected = mma_cases.wgrad_case(rng, run, kind, ks, 20, 12, dtype, n=120, schedule="random",
                                                    seed=ks)
    check(dw, expected, dtype)


@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_partitions_summed_in_order(rng, dt):
    """Several partitions per offset (enough edges), reduced in order, on a
    relation and on a 1x1x1 product without one."""
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 3000, extent=16, batches=1)
    x, ct = operands(rng, rows_in, n_out, 12, 9, dtype)
    assert len(program(x, ct, rel._native, 27, dtype)["steps"]) == 2
    check(run(x, ct, rel, 27, schedule="random"), reference(edges, x, ct, 27), dtype)
    x, ct = operands(rng, 1100, 1100, 9, 33, dtype)
    prog = program(x, ct, None, 1, dtype)
    assert prog["steps"][0]["groups"][1] == 3
    check(run(x, ct, None, 1, schedule="reverse"), (f64(x).T @ f64(ct))[None], dtype)


def test_relation_without_edges(rng):
    native = mma_cases.edgeless_native()
    x, ct = operands(rng, 2, 1, 6, 10, mx.float16)
    dw = metal_programs.weight_grad(ROUTE, x, ct, native, 27, schedule="random")
    np.testing.assert_array_equal(dw, 0)


@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_same_bits_every_run(rng, dt):
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 2000, extent=14, batches=1)
    x, ct = operands(rng, rows_in, n_out, 20, 36, dtype)
    assert len(program(x, ct, rel._native, 27, dtype)["steps"]) == 2  # partitions too
    dw = mma_cases.same_bits(lambda s, seed: run(x, ct, rel, 27, schedule=s, seed=seed), mma_cases.SCHEDULES[:3])
    check(dw, reference(edges, x, ct, 27), dtype)


def test_256_channels(rng):
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 70, extent=5, batches=1)
    x, ct = operands(rng, rows_in, n_out, 256, 256, mx.bfloat16)
    check(run(x, ct, rel, 27, schedule="random"), reference(edges, x, ct, 27), mx.bfloat16)


# ------------------------------------------------------------------ coverage
def test_this_file_runs_every_kernel_of_wgrad_mma_metal():
    assert mma_cases.kernels_of("wgrad_mma.metal") == KERNELS
