"""Grouped products on matrix units: metal.grouped_csr_mma (forward and
input gradient, the kernels of metal/csr_mma.metal with a group dimension,
src/metal/csr_mma.cpp) and metal.grouped_wgrad_mma (weight gradient, the
kernels of metal/wgrad_mma.metal, src/metal/wgrad_mma.cpp).

Selection: every grouped dense product whose groups have at least 8 input
and 8 output channels, in float32, float16 and bfloat16, ahead of the
scalar grouped routes, which keep narrower groups (depthwise). Execution:
the routes' programs through the CPU harness (the GPU on a Mac) against
per-group float64 sums over the oracle's edges (tests/oracle.py, from
coordinates alone; one case also against oracle.apply on the expanded
weight), for 8, 12, 16, 24 and 64 channels a group and 4 groups of 256,
kernel volumes 1, 8 and 27, every map kind, forward, input and weight
gradients, empty relations and partial tiles; and the same bits whatever
order the threads run in.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_lattice import _ext, routes

import metal_programs
import mma_cases
import oracle
from metal_programs import INPUT_MAJOR, OUTPUT_MAJOR, relation
from mma_cases import DTYPES, TOL, WTOL, check, f64, features, wgrad_reference
from mma_cases import weight as grouped_weight

pytestmark = metal_programs.MARKS

CONV = "metal.grouped_csr_mma"
WGRAD = "metal.grouped_wgrad_mma"
# TOL (products) and WTOL (weight gradients) as the ungrouped routes':
# float32 accumulation of the rounded operands, one rounding to the output
# dtype.


# ------------------------------------------------------------------ operands and references
def transposed(w: mx.array, groups: int) -> mx.array:
    """The input gradient's weight (K, C_out / G, C_in): each group's block
    transposed, as autodiff builds it (src/core/primitives.cpp)."""
    k, ag, c_out = w.shape
    bg = c_out // groups
    return mx.reshape(mx.transpose(mx.reshape(w, (k, ag, groups, bg)), (0, 3, 2, 1)), (k, bg, ag * groups))


def conv_reference(edges, x, w, rows, groups):
    return mma_cases.reference(edges, x, w, rows, groups=groups)


def dgrad_reference(edges, ct, w, rows_in, groups):
    return mma_cases.reference(edges, ct, w, rows_in, transpose=True, groups=groups)


def conv(x, w, rel, groups, view=OUTPUT_MAJOR, schedule="forward", seed=0):
    return mma_cases.conv(x, w, rel, view, schedule, seed, route=CONV, groups=groups)


def wgrad(x, ct, rel, k, groups, schedule="forward", seed=0):
    return mma_cases.wgrad(x, ct, rel, k, schedule, seed, route=WGRAD, groups=groups)


# ------------------------------------------------------------------ selection
def ctx(direction="forward", **kw):
    if direction != "forward":
        kw = {"kernel_size": None, "k": 27, **kw}
    return mma_cases.conv_ctx(direction, **kw)


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("direction", ["forward", "dgrad", "wgrad"])
@pytest.mark.parametrize(
    "c_in,c_out,groups,matrix",
    [
        (32, 32, 4, True),      # 8 channels a group
        (48, 48, 4, True),      # 12
        (64, 128, 4, True),     # 16 -> 32
        (1024, 1024, 4, True),  # 256
        (32, 64, 8, False),     # 4 input channels a group
        (64, 32, 8, False),     # 4 output channels a group
        (16, 16, 16, False),    # depthwise
        (16, 32, 16, False),    # depthwise, multiplier 2
    ],
)
def test_selection(dt, direction, c_in, c_out, groups, matrix):
    """Groups of >= 8 channels on matrix units, narrower ones on the scalar
    grouped kernels; every dtype on the GPU (no CPU fallback)."""
    sel = routes.select(ctx(direction, dtype=dt, c_in=c_in, c_out=c_out, groups=groups))
    assert sel.fallback is None and sel.route.backend == "metal"
    if matrix:
        expected = WGRAD if direction == "wgrad" else CONV
    else:
        expected = "metal.grouped_wgrad" if direction == "wgrad" else "metal.grouped_fetch_on_demand"
    assert sel.route.name == expected


def test_route_flags():
    for name, passes, scalar in ((CONV, ("forward", "dgrad"), "metal.grouped_fetch_on_demand"),
                                 (WGRAD, ("wgrad",), "metal.grouped_wgrad")):
        r = routes.get(name)
        assert r.grouped and r.matrix_unit and r.deterministic and r.passes == passes
        assert r.priority > routes.get(scalar).priority
        assert "C_in / groups >= 8 and C_out / groups >= 8" in r.predicate
    assert routes.get(CONV).table_file == "src/metal/csr_mma.cpp"
    assert routes.get(WGRAD).table_file == "src/metal/wgrad_mma.cpp"
    # ungrouped products never take them
    assert routes.select(ctx(c_in=64, c_out=64)).route.name == "metal.csr_mma"


# ------------------------------------------------------------------ programs
@pytest.mark.parametrize("ag,bg,groups,bn", [(8, 8, 4, 16), (12, 24, 3, 32), (16, 40, 2, 64), (64, 64, 2, 64),
                                             (256, 256, 4, 128)])
def test_conv_program(rng, ag, bg, groups, bn):
    rel, rows_in, n_out, _ = relation(rng, "submanifold", 60)
    x = features(rng, rows_in, ag * groups, mx.bfloat16)
    w = grouped_weight(rng, 27, ag, bg * groups, mx.bfloat16)
    inputs = _ext.conv_inputs(x, w, rel._native, OUTPUT_MAJOR, CONV, groups=groups)
    prog = _ext.metal_program("conv", CONV, inputs, [n_out, bg * groups], mx.bfloat16, groups=groups)
    (step,) = prog["steps"]
    assert step["kernel"] == f"csr_mma_bfloat16_n{bn}"
    # (group, column block) pairs fastest, then the 32-row blocks
    assert tuple(step["groups"]) == (groups * -(-bg // bn), -(-n_out // 32), 1)
    assert tuple(step["threads"]) == (128, 1, 1)
    assert [nm for _, _, nm in step["buffers"]] == [
        "x", "w", "offsets", "gather", "k", "row_order", "y", "params"]
    params = np.frombuffer(step["buffers"][-1][1], np.int32).tolist()
    assert params == [n_out, ag * groups, bg * groups, ag, bg, -1]
    with pytest.raises(ValueError, match="grouped_csr_mma needs output channels divisible"):
        _ext.metal_program("conv", CONV, inputs, [n_out, bg * groups + 1], mx.bfloat16, groups=groups)


def test_wgrad_program(rng):
    rel, rows_in, n_out, _ = relation(rng, "submanifold", 60)
    x, ct = features(rng, rows_in, 48, mx.float16), features(rng, n_out, 96, mx.float16)
    inputs = _ext.weight_grad_inputs(x, ct, rel._native, OUTPUT_MAJOR)
    prog = _ext.metal_program("weight_grad", WGRAD, inputs, [27, 12, 96], mx.float16, groups=4)
    (step,) = prog["steps"]
    # 4 groups x one 32-row block x one 32-column block, one partition, 27 offsets
    assert step["kernel"] == "wgrad_mma_float16_n32" and tuple(step["groups"]) == (4, 1, 27)
    assert np.frombuffer(step["buffers"][-1][1], np.int32).tolist() == [27, 12, 96, 1, -1, 4]
    # 2000 rows of a 1x1x1 product: partitions of the edges, reduced in order
    x, ct = features(rng, 2000, 128, mx.float32), features(rng, 2000, 256, mx.float32)
    inputs = _ext.weight_grad_inputs(x, ct, None, OUTPUT_MAJOR)
    prog = _ext.metal_program("weight_grad", WGRAD, inputs, [1, 64, 256], mx.float32, groups=2)
    first, reduce = prog["steps"]
    assert first["kernel"] == "wgrad_mma_float32_n64" and tuple(first["groups"]) == (2 * 2 * 2, 4, 1)
    assert np.frombuffer(first["buffers"][-1][1], np.int32).tolist() == [1, 64, 256, 4, 2000, 2]
    assert reduce["kernel"] == "wgrad_reduce_float32"
    assert np.frombuffer(reduce["buffers"][-1][1], np.int32).tolist() == [1, 64, 256, 4]
    with pytest.raises(ValueError, match="grouped_wgrad_mma needs the weight's input channels times the group"):
        _ext.metal_program("weight_grad", WGRAD, inputs, [1, 48, 256], mx.float32, groups=2)


# ------------------------------------------------------------------ forward
# (kind, ks, C_in / G, C_out / G, groups, dtype, schedule): channels a group
# 8, 12, 16, 24 and 64, K 1, 8 and 27, every map kind and dtype; partial
# column blocks (12, 24, 40 of 16, 32, 64) and row blocks.
FORWARD = [
    ("submanifold", 3, 8, 8, 4, "float32", "forward"),
    ("forward", 3, 12, 12, 3, "float16", "random"),
    ("target", 3, 16, 16, 2, "bfloat16", "reverse"),
    ("transposed", 2, 24, 24, 2, "float32", "random"),
    ("generative", 3, 8, 16, 2, "float16", "forward"),
    ("submanifold", 1, 64, 64, 2, "bfloat16", "random"),
    ("forward", 2, 12, 24, 4, "bfloat16", "reverse"),
    ("submanifold", 3, 64, 40, 2, "float16", "random"),
    ("target", 3, 24, 8, 3, "float32", "forward"),
    ("generative", 3, 16, 12, 3, "bfloat16", "random"),
    ("transposed", 2, 8, 8, 8, "float16", "reverse"),
    ("forward", 2, 64, 64, 2, "float32", "random"),
]


@pytest.mark.parametrize("kind,ks,ag,bg,groups,dt,schedule", FORWARD)
def test_forward(rng, kind, ks, ag, bg, groups, dt, schedule):
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, kind, 110, ks)
    x = features(rng, rows_in, ag * groups, dtype)
    w = grouped_weight(rng, rel.kernel_volume, ag, bg * groups, dtype)
    y = conv(x, w, rel, groups, schedule=schedule, seed=ag)
    assert y.shape == (n_out, bg * groups)
    check(y, conv_reference(edges, x, w, n_out, groups), TOL[dtype])


def test_forward_against_the_oracle_on_the_expanded_weight(rng):
    """The per-group reference above agrees with oracle.apply on the full
    weight that is zero outside each group's block."""
    groups, ag, bg = 2, 8, 12
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 60)
    x = features(rng, rows_in, ag * groups, mx.float32)
    w = grouped_weight(rng, 27, ag, bg * groups, mx.float32)
    w5 = np.array(w).reshape(3, 3, 3, ag, bg * groups).transpose(4, 0, 1, 2, 3)  # (C_out, k, k, k, C_in / G)
    expected = oracle.apply(edges, f64(x), oracle.expand_grouped(w5, groups), n_out)
    np.testing.assert_allclose(conv_reference(edges, x, w, n_out, groups), expected, rtol=1e-12, atol=1e-12)
    check(conv(x, w, rel, groups, schedule="random"), expected, TOL[mx.float32])


@pytest.mark.parametrize("dt", list(DTYPES))
def test_pointwise_without_relation(rng, dt):
    dtype = DTYPES[dt]
    x = features(rng, 45, 36, dtype)
    w = grouped_weight(rng, 1, 12, 48, dtype)
    y = conv(x, w, None, 3, schedule="random")
    edges = np.stack([np.arange(45), np.arange(45), np.zeros(45, np.int64)], axis=1)
    check(y, conv_reference(edges, x, w, 45, 3), TOL[dtype])


def test_four_groups_of_256_channels(rng):
    """Two column blocks of 128 a group and 16 slices of 16 input channels
    per round."""
    rel, rows_in, n_out, edges = relation(rng, "forward", 60, ks=2, extent=5, batches=1)
    x = features(rng, rows_in, 1024, mx.float16)
    w = grouped_weight(rng, 8, 256, 1024, mx.float16)
    y = conv(x, w, rel, 4, schedule="random")
    check(y, conv_reference(edges, x, w, n_out, 4), TOL[mx.float16])


# ------------------------------------------------------------------ input gradient
@pytest.mark.parametrize(
    "kind,ks,ag,bg,groups,dt",
    [
        ("submanifold", 3, 8, 8, 4, "bfloat16"),
        ("forward", 2, 12, 24, 2, "float32"),
        ("target", 3, 24, 12, 3, "float16"),
        ("transposed", 2, 16, 16, 2, "bfloat16"),
        ("generative", 3, 64, 64, 2, "float32"),
        ("submanifold", 1, 16, 8, 4, "float16"),
    ],
)
def test_input_gradient(rng, kind, ks, ag, bg, groups, dt):
    """The grouped product over the input-major view with each group's block
    of W transposed."""
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, kind, 110, ks)
    w = grouped_weight(rng, rel.kernel_volume, ag, bg * groups, dtype)
    ct = features(rng, n_out, bg * groups, dtype)
    dx = conv(ct, transposed(w, groups), rel, groups, view=INPUT_MAJOR, schedule="random", seed=5)
    assert dx.shape == (rows_in, ag * groups)
    check(dx, dgrad_reference(edges, ct, w, rows_in, groups), TOL[dtype])


# ------------------------------------------------------------------ weight gradient
@pytest.mark.parametrize(
    "kind,ks,ag,bg,groups,dt,schedule",
    [
        ("submanifold", 3, 8, 8, 4, "float32", "random"),
        ("forward", 2, 12, 12, 3, "bfloat16", "forward"),
        ("target", 3, 16, 24, 2, "float16", "reverse"),
        ("transposed", 2, 24, 16, 2, "float32", "random"),
        ("generative", 3, 64, 64, 2, "bfloat16", "random"),
        ("submanifold", 1, 40, 72, 2, "float16", "random"),
        ("forward", 3, 8, 16, 8, "float16", "forward"),
    ],
)
def test_weight_gradient(rng, kind, ks, ag, bg, groups, dt, schedule):
    dtype = DTYPES[dt]
    rel, rows_in, n_out, edges = relation(rng, kind, 110, ks)
    k = rel.kernel_volume
    x, ct = features(rng, rows_in, ag * groups, dtype), features(rng, n_out, bg * groups, dtype, 0.25)
    dw = wgrad(x, ct, rel, k, groups, schedule=schedule, seed=bg)
    assert dw.shape == (k, ag, bg * groups)
    check(dw, wgrad_reference(edges, x, ct, k, groups), WTOL[dtype])


@pytest.mark.parametrize("dt", list(DTYPES))
def test_weight_gradient_partitions_summed_in_order(rng, dt):
    """A 1x1x1 product of 2000 rows: several partitions per offset, the
    partials added in order by wgrad_reduce."""
    dtype = DTYPES[dt]
    x, ct = features(rng, 2000, 48, dtype), features(rng, 2000, 24, dtype, 0.25)
    inputs = _ext.weight_grad_inputs(x, ct, None, OUTPUT_MAJOR)
    assert len(_ext.metal_program("weight_grad", WGRAD, inputs, [1, 16, 24], dtype, groups=3)["steps"]) == 2
    dw = wgrad(x, ct, None, 1, 3, schedule="random")
    edges = np.stack([np.arange(2000), np.arange(2000), np.zeros(2000, np.int64)], axis=1)
    check(dw, wgrad_reference(edges, x, ct, 1, 3), WTOL[dtype])


def test_weight_gradient_four_groups_of_256_channels(rng):
    rel, rows_in, n_out, edges = relation(rng, "forward", 60, ks=2, extent=5, batches=1)
    x, ct = features(rng, rows_in, 1024, mx.bfloat16), features(rng, n_out, 1024, mx.bfloat16, 0.25)
    dw = wgrad(x, ct, rel, 8, 4, schedule="random")
    check(dw, wgrad_reference(edges, x, ct, 8, 4), WTOL[mx.bfloat16])


# ------------------------------------------------------------------ empty inputs
def test_empty_relations_and_rows_without_edges(rng):
    coords, s, rel = mma_cases.edgeless(rng, 30)
    x, w = features(rng, len(coords), 32, mx.float16), grouped_weight(rng, 27, 16, 32, mx.float16)
    np.testing.assert_array_equal(conv(x, w, rel, 2, schedule="reverse"), 0)
    ct = features(rng, 3, 32, mx.float16)
    np.testing.assert_array_equal(wgrad(x, ct, rel, 27, 2), 0)
    # rows with and without edges in one row block
    out = np.concatenate([mma_cases.FAR, coords[:7]]).astype(np.int32)
    rel = mma_cases.target_relation(s, out)
    y = conv(x, w, rel, 2, schedule="random")
    np.testing.assert_array_equal(y[:3], 0)
    check(y, conv_reference(oracle.conv_edges(coords, out, 3, 1, 1), x, w, len(out), 2), TOL[mx.float16])
    # no output rows
    empty = mma_cases.target_relation(s, mx.zeros((0, 4), mx.int32))
    assert conv(x, w, empty, 2).shape == (0, 32)
    np.testing.assert_array_equal(wgrad(x, mx.zeros((0, 32), mx.float16), empty, 27, 2), 0)


# ------------------------------------------------------------------ determinism


@pytest.mark.parametrize("dt", list(DTYPES))
def test_same_bits_every_run(rng, dt):
    """Forward, input and weight gradients: each element summed in one
    order, the same bits whatever order threads and threadgroups run in."""
    dtype = DTYPES[dt]
    groups, ag, bg = 3, 16, 12
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 120)
    x, w = features(rng, rows_in, ag * groups, dtype), grouped_weight(rng, 27, ag, bg * groups, dtype)
    ct = features(rng, n_out, bg * groups, dtype, 0.25)
    wt = transposed(w, groups)
    for run, expected, tol in (
        (lambda s, q: conv(x, w, rel, groups, schedule=s, seed=q), conv_reference(edges, x, w, n_out, groups), TOL),
        (lambda s, q: conv(ct, wt, rel, groups, view=INPUT_MAJOR, schedule=s, seed=q),
         dgrad_reference(edges, ct, w, rows_in, groups), TOL),
        (lambda s, q: wgrad(x, ct, rel, 27, groups, schedule=s, seed=q),
         wgrad_reference(edges, x, ct, 27, groups), WTOL),
    ):
        check(mma_cases.same_bits(run), expected, tol[dtype])
    # partitioned weight gradients too
    x, ct = features(rng, 1500, 32, dtype), features(rng, 1500, 32, dtype, 0.25)
    mma_cases.same_bits(lambda s, q: wgrad(x, ct, None, 1, 2, schedule=s, seed=q))


def test_same_result_as_the_scalar_grouped_routes(rng):
    """The scalar grouped kernels stay reachable by name and agree."""
    groups, ag, bg = 2, 8, 8
    rel, rows_in, n_out, edges = relation(rng, "forward", 100, 3)
    x, w = features(rng, rows_in, ag * groups, mx.float32), grouped_weight(rng, 27, ag, bg * groups, mx.float32)
    native = rel._native
    scalar = metal_programs.conv("metal.grouped_fetch_on_demand", x, w, native, groups=groups)
    np.testing.assert_allclose(conv(x, w, rel, groups), scalar, rtol=1e-5, atol=1e-5)
    ct = features(rng, n_out, bg * groups, mx.float32)
    scalar = metal_programs.weight_grad("metal.grouped_wgrad", x, ct, native, 27, groups=groups)
    np.testing.assert_allclose(wgrad(x, ct, rel, 27, groups), scalar, rtol=1e-5, atol=1e-5)
