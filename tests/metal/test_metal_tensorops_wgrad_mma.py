"""metal.tensorops_wgrad_mma (metal/tensorops_wgrad_mma.metal,
src/metal/tensorops_wgrad_mma.cpp): metal.wgrad_mma's program with each
16-edge chunk's products one TensorOps matmul2d (emulated by the harness).

Selection: every dense weight gradient (float32, float16, bfloat16) on a
TensorOps tier but the seed TensorOps contraction's; never without
TensorOps. Execution: the route's program through the CPU harness against
the oracle's sums and against its direct twin metal.wgrad_mma, for every map
kind, kernel volumes 1, 8, 27 and 125, channels 8 to 256 (and 1024), the
three dtypes, one and several partitions, empty relations; the same bits
under every thread schedule.
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
from mma_cases import wgrad_program as program
from mma_cases import wgrad_reference as reference

pytestmark = metal_programs.MARKS

ROUTE = "metal.tensorops_wgrad_mma"
TWIN = "metal.wgrad_mma"
# Against the twin: the same float products summed in another order within
# a chunk, so at most one rounding step of the dtype apart.
TWIN_TOL = {
    mx.float32: dict(rtol=1e-5, atol=1e-6),
    mx.float16: dict(rtol=2.0**-10, atol=2.0**-14),
    mx.bfloat16: dict(rtol=2.0**-7, atol=2.0**-14),
}
KERNELS = {f"tensorops_wgrad_mma_{dt}_n{bn}" for dt in DTYPES for bn in (32, 64)}


def run(x, ct, rel, k, schedule="forward", seed=0, route=ROUTE):
    return mma_cases.wgrad(x, ct, rel, k, schedule, seed, route=route)


def magnitude(edges, x, ct, k):
    """Sums of |x[i]| |ct[o]| over each element's products: a float sum of
    them in any order is within (edges - 1) * 2^-24 of this of the exact."""
    return reference(edges, mx.abs(x), mx.abs(ct), k)


def _close(actual, desired, tol, scale):
    """|actual - desired| <= atol + rtol |desired| + 2^-20 scale: the
    dtype's rounding plus the float sums' (of up to thousands of products,
    which cancel to small elements)."""
    diff = np.abs(actual.astype(np.float64) - desired)
    allowed = tol["atol"] + tol["rtol"] * np.abs(desired) + 2.0**-20 * scale
    bad = diff > allowed
    assert not bad.any(), (f"{bad.sum()} of {bad.size} elements off; worst at "
                           f"{np.unravel_index(np.argmax(diff - allowed), diff.shape)}")


def check(dw, expected, dtype, scale=0.0):
    assert not np.isnan(dw).any(), "weights left unwritten"
    _close(dw, expected, TOL[dtype], scale)


def check_twin(x, ct, rel, k, dtype, dw, schedule="forward", scale=0.0):
    twin = run(x, ct, rel, k, schedule=schedule, route=TWIN)
    _close(dw, twin.astype(np.float64), TWIN_TOL[dtype], scale)


# ------------------------------------------------------------------ selection
def ctx(**kw):
    return mma_cases.wgrad_ctx(**{"tensor_ops": True, **kw})


@pytest.mark.parametrize(
    "kw",
    [
        dict(c_in=8, c_out=8),
        dict(c_in=7, c_out=12, k=8),
        dict(c_in=24, c_out=40, dtype="float16"),
        dict(c_in=40, c_out=24, dtype="bfloat16", map_kind="target"),
        dict(c_in=96, c_out=128, k=125, map_kind="generative"),
        dict(c_in=256, c_out=256, dtype="bfloat16", n_in=100000),
        dict(c_in=1024, c_out=1024, k=1, dtype="float16"),
        dict(c_in=48, c_out=64, n_in=32768),  # no compile-time tile of the seed
        dict(c_in=32, c_out=64, n_in=1000),  # the seed's channels, too few rows for it
        dict(c_in=64, c_out=64, n_in=32768, dtype="bfloat16"),  # the seed has no bfloat16
    ],
)
def test_selected_on_tensorops(kw):
    assert routes.select(ctx(**kw)).route.name == ROUTE
    # the direct twin everywhere else
    assert routes.select(ctx(**{**kw, "tensor_ops": False})).route.name == TWIN


@pytest.mark.parametrize(
    "kw,route",
    [
        # the seed TensorOps contraction stays ahead where it applies
        (dict(c_in=32, c_out=64, n_in=32768), "metal.tensorops_wgrad"),
        (dict(c_in=16, c_out=16, n_in=32768, dtype="float16"), "metal.tensorops_wgrad"),
        # grouped products keep their routes
        (dict(c_in=64, c_out=64, groups=2), "metal.grouped_wgrad_mma"),
        (dict(c_in=16, c_out=16, groups=4), "metal.grouped_wgrad"),
        # quantized weights have no weight gradient here
    ],
)
def test_other_routes_kept(kw, route):
    assert routes.select(ctx(**kw)).route.name == route


def test_tiers():
    """The Mac plan's tiers: taken on M5 (Apple10, macOS 26.2), not on M3 /
    M4, and counted as matrix-unit work."""
    record = dict(op="wgrad of test", map_kind="submanifold", dtype="float16", kernel_size=[3, 3, 3],
                  k=27, direction="wgrad", c_in=96, c_out=96, n_in=5000, n_out=5000, edges=60000)
    mma_cases.assert_tensorops_tiers(record, ROUTE, TWIN)


def test_route_flags():
    r = routes.get(ROUTE)
    assert r.deterministic and r.matrix_unit and not r.grouped and r.passes == ("wgrad",)
    assert r.table_file == "src/metal/tensorops_wgrad_mma.cpp"
    assert routes.get(TWIN).priority < r.priority < routes.get("metal.tensorops_wgrad").priority
    assert "metal.wgrad_mma" in r.summary and "direct twin" in r.summary


# ------------------------------------------------------------------ program
def test_program_is_the_twins_with_tensorops_kernels(rng):
    for rows, c_in, c_out, k, dtype, native in ((60, 5, 40, 27, mx.float16, True),
                                                  (3000, 70, 20, 1, mx.bfloat16, False)):
        if native:
            rel, rows_in, n_out, _ = relation(rng, "submanifold", rows)
            x, ct = operands(rng, rows_in, n_out, c_in, c_out, dtype)
            nat = rel._native
        else:
            x, ct = operands(rng, rows, rows, c_in, c_out, dtype)
            nat = None
        mine, twin = program(ROUTE, x, ct, nat, k, dtype), program(TWIN, x, ct, nat, k, dtype)
        assert mine["temps"] == twin["temps"] and len(mine["steps"]) == len(twin["steps"])
        for a, b in zip(mine["steps"], twin["steps"]):
            kernel = b["kernel"] if b["kernel"].startswith("wgrad_reduce") else "tensorops_" + b["kernel"]
            assert a["kernel"] == kernel
            assert tuple(a["groups"]) == tuple(b["groups"]) and tuple(a["threads"]) == tuple(b["threads"])
            assert a["buffers"] == b["buffers"]
    # the second: 6 partitions of about 512 edges, then their ordered sum
    first, reduce = mine["steps"]
    assert first["kernel"] == "tensorops_wgrad_mma_bfloat16_n32" and tuple(first["groups"]) == (3, 6, 1)
    assert reduce["kernel"] == "wgrad_reduce_bfloat16"


# ------------------------------------------------------------------ every map kind
CASES = mma_cases.WEIGHT_GRADIENT + [("transposed", 2, 128, 24, "bfloat16", "reverse")]


@pytest.mark.parametrize("kind,ks,c_in,c_out,dt,schedule", CASES)
def test_weight_gradient(rng, kind, ks, c_in, c_out, dt, schedule):
    dtype = DTYPES[dt]
    x, ct, rel, dw, expected = mma_cases.wgrad_case(rng, run, kind, ks, c_in, c_out, dtype, schedule=schedule,
                                                    seed=c_in)
    check(dw, expected, dtype)
    check_twin(x, ct, rel, rel.kernel_volume, dtype, dw, schedule)


@pytest.mark.parametrize("ks,kind", [(1, "submanifold"), (2, "forward"), (3, "target"), (5, "submanifold")])
@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_kernel_volumes(rng, ks, kind, dt):
    """K = 1, 8, 27 and 125."""
    dtype = DTYPES[dt]
    x, ct, rel, dw, expected = mma_cases.wgrad_case(rng, run, kind, ks, 20, 12, dtype, n=120, schedule="random",
                                                    seed=ks)
    assert rel.kernel_volume == ks**3
    check(dw, expected, dtype)
    check_twin(x, ct, rel, rel.kernel_volume, dtype, dw)


@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_partitions_summed_in_order(rng, dt):
    """Several partitions per offset (enough edges), reduced in order, on a
    relation and on a 1x1x1 product without one."""
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 3000, extent=16, batches=1)
    x, ct = operands(rng, rows_in, n_out, 12, 9, dtype)
    assert len(program(ROUTE, x, ct, rel._native, 27, dtype)["steps"]) == 2
    dw = run(x, ct, rel, 27, schedule="random")
    scale = magnitude(edges, x, ct, 27)
    check(dw, reference(edges, x, ct, 27), dtype, scale)
    check_twin(x, ct, rel, 27, dtype, dw, scale=scale)
    x, ct = operands(rng, 1100, 1100, 9, 33, dtype)
    assert program(ROUTE, x, ct, None, 1, dtype)["steps"][0]["groups"][1] == 3
    dw = run(x, ct, None, 1, schedule="reverse")
    scale = (np.abs(f64(x)).T @ np.abs(f64(ct)))[None]
    check(dw, (f64(x).T @ f64(ct))[None], dtype, scale)
    check_twin(x, ct, None, 1, dtype, dw, scale=scale)


def test_relation_without_edges(rng):
    native = mma_cases.edgeless_native()
    for dtype in DTYPES.values():
        x, ct = operands(rng, 2, 1, 6, 70, dtype)
        dw = run(x, ct, native, 27, schedule="random")
        np.testing.assert_array_equal(dw, 0)


@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_same_bits_every_run(rng, dt):
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 2000, extent=14, batches=1)
    x, ct = operands(rng, rows_in, n_out, 20, 36, dtype)
    assert len(program(ROUTE, x, ct, rel._native, 27, dtype)["steps"]) == 2  # partitions too
    dw = mma_cases.same_bits(lambda s, seed: run(x, ct, rel, 27, schedule=s, seed=seed))
    check(dw, reference(edges, x, ct, 27), dtype, magnitude(edges, x, ct, 27))


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_256_channels(rng, dt):
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 70, extent=5, batches=1)
    x, ct = operands(rng, rows_in, n_out, 256, 256, dtype)
    dw = run(x, ct, rel, 27, schedule="random")
    check(dw, reference(edges, x, ct, 27), dtype)
    check_twin(x, ct, rel, 27, dtype, dw)


def test_1024_channels(rng):
    """C_in = C_out = 1024: 32 x 16 blocks per offset, partial blocks none."""
    rel, rows_in, n_out, edges = relation(rng, "forward", 40, ks=2)
    x, ct = operands(rng, rows_in, n_out, 1024, 1024, mx.float16)
    dw = run(x, ct, rel, 8, schedule="random")
    check(dw, reference(edges, x, ct, 8), mx.float16)
    check_twin(x, ct, rel, 8, mx.float16, dw)


# ------------------------------------------------------------------ coverage
def test_this_file_runs_every_kernel_of_tensorops_wgrad_mma_metal():
    assert mma_cases.kernels_of("tensorops_wgrad_mma.metal") == KERNELS
