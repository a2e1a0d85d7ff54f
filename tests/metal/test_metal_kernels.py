"""metal/fetch_on_demand.metal against per-edge NumPy sums.

fetch_on_demand_{float32,float16} and wgrad_direct_{float32,float16} run as the
programs of the metal.fetch_on_demand and metal.wgrad_direct routes
(src/metal/fetch_on_demand.cpp, read through _ext.metal_program) on the primitives'
own inputs (_ext.conv_inputs, _ext.weight_grad_inputs), for relations built
by the project. On Linux the programs run through the CPU harness
(tests/metal/metal_harness, via tests/metal_programs.py); on a Mac with a Metal
build of mlx_lattice the primitives encode the same programs on the GPU.
"""

from __future__ import annotations


import mlx.core as mx
import numpy as np
import pytest

from mlx_lattice import _ext

import metal_harness as mh
import metal_programs
from conftest import METAL_KERNEL_TOLERANCES

KERNELS = ("fetch_on_demand_float32", "fetch_on_demand_float16", "wgrad_direct_float32", "wgrad_direct_float16")
DTYPES = {"float32": np.float32, "float16": np.float16}
TOL = {"float32": METAL_KERNEL_TOLERANCES[mx.float32], "float16": METAL_KERNEL_TOLERANCES[mx.float16]}
CONV_ROUTE = "metal.fetch_on_demand"
GRAD_ROUTE = "metal.wgrad_direct"


BACKEND = metal_programs.BACKEND
pytestmark = metal_programs.MARKS


# ---------------------------------------------------------------- relations


def make_coords(rng, n, extent=7, batches=2) -> np.ndarray:
    pts = np.concatenate(
        [rng.integers(0, batches, (n, 1)), rng.integers(0, extent, (n, 3))], axis=1
    ).astype(np.int32)
    return np.unique(pts, axis=0)


def submanifold(coords, out_coords=None):
    t = _ext.CoordTable(mx.array(coords))
    out = t.coords if out_coords is None else mx.array(out_coords)
    return _ext.build_relation(t, out, (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), False, "submanifold")


def strided(coords):
    t = _ext.CoordTable(mx.array(coords))
    spec = ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    out = _ext.forward_support(t, *spec)
    return _ext.build_relation(t, out, *spec, False, "conv")


def edges(rel):
    """(out, in, k) of every edge, from the output-major CSR."""
    off = np.array(rel.out_offsets)
    out = np.repeat(np.arange(rel.n_out), np.diff(off))
    return out, np.array(rel.in_idx), np.array(rel.k_idx)


# ---------------------------------------------------------------- references


def ref_conv(x, w, dst, src, k, rows):
    """y[dst] += x[src] @ w[k] over the edges, in float64."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    y = np.zeros((rows, w.shape[2]))
    np.add.at(y, dst, np.einsum("ea,eab->eb", x64[src], w64[k]))
    return y


def ref_weight_grad(x, ct, src, dst, k, kvol):
    """dw[k] += outer(x[src], ct[dst]) over the edges, in float64."""
    dw = np.zeros((kvol, x.shape[1], ct.shape[1]))
    np.add.at(dw, k, x.astype(np.float64)[src][:, :, None] * ct.astype(np.float64)[dst][:, None, :])
    return dw


# ---------------------------------------------------------------- runners


def csr_arrays(rel, view):
    """The index buffers of a CSR view (see src/core/primitives.cpp)."""
    if view == metal_programs.OUTPUT_MAJOR:
        return rel.n_out, np.array(rel.out_offsets), np.array(rel.in_idx), np.array(rel.k_idx)
    off, _, out_idx, k = rel.input_major()
    return rel.n_in, np.array(off), np.array(out_idx), np.array(k)


def gather_conv(x, w, rel, view=metal_programs.OUTPUT_MAJOR, schedule="forward", seed=0):
    """y of the GatherConv primitive through the fetch-on-demand program."""
    return metal_programs.conv(CONV_ROUTE, mx.array(x), mx.array(w), rel, view, schedule=schedule, seed=seed)


def weight_grad(x, ct, rel, kvol, view=metal_programs.OUTPUT_MAJOR, schedule="forward", seed=0):
    """dw of the WeightGrad primitive through the direct weight-gradient program."""
    return metal_programs.weight_grad(
        GRAD_ROUTE, mx.array(x), mx.array(ct), rel, kvol, view, schedule=schedule, seed=seed)


def check(got, ref, dt):
    got = got.astype(np.float64)
    assert not np.isnan(got).any(), "outputs left unwritten"
    np.testing.assert_allclose(got, ref, **TOL[dt])


# ---------------------------------------------------------------- gather_conv


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize(
    "a,b,schedule", [(1, 1, "forward"), (7, 33, "reverse"), (33, 7, "random"), (16, 64, "forward")]
)
def test_gather_conv_submanifold(dt, a, b, schedule):
    rng = np.random.default_rng(a * 100 + b)
    coords = make_coords(rng, 140)
    rel = submanifold(coords)
    n = rel.n_out
    x = rng.standard_normal((n, a)).astype(DTYPES[dt])
    w = (rng.standard_normal((27, a, b)) / np.sqrt(a)).astype(DTYPES[dt])
    y = gather_conv(x, w, rel, schedule=schedule, seed=a)
    out, inp, k = edges(rel)
    check(y, ref_conv(x, w, out, inp, k, n), dt)


def test_rows_not_a_multiple_of_eight_and_cpu_agreement():
    rng = np.random.default_rng(5)
    coords = make_coords(rng, 61)
    rel = submanifold(coords)
    assert rel.n_out % 8 != 0
    x = rng.standard_normal((rel.n_out, 5)).astype(np.float32)
    w = rng.standard_normal((27, 5, 3)).astype(np.float32)
    y = gather_conv(x, w, rel, schedule="random", seed=11)
    out, inp, k = edges(rel)
    check(y, ref_conv(x, w, out, inp, k, rel.n_out), "float32")
    cpu = _ext.gather_conv(mx.array(x), mx.array(w), rel, metal_programs.OUTPUT_MAJOR, "cpu.gather_gemm", stream=mx.default_stream(mx.cpu))
    np.testing.assert_allclose(y, np.array(cpu), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_gather_conv_input_major_view(dt):
    # The transposed direction (input gradient): rows are the relation's
    # inputs, gathered from its outputs.
    rng = np.random.default_rng(6)
    rel = strided(make_coords(rng, 150))
    assert rel.n_in != rel.n_out
    x = rng.standard_normal((rel.n_out, 9)).astype(DTYPES[dt])
    w = rng.standard_normal((rel.kernel_volume, 9, 34)).astype(DTYPES[dt])
    y = gather_conv(x, w, rel, view=metal_programs.INPUT_MAJOR, schedule="reverse")
    out, inp, k = edges(rel)
    check(y, ref_conv(x, w, inp, out, k, rel.n_in), dt)


def test_gather_conv_strided():
    rng = np.random.default_rng(7)
    rel = strided(make_coords(rng, 150))
    x = rng.standard_normal((rel.n_in, 4)).astype(np.float32)
    w = rng.standard_normal((8, 4, 6)).astype(np.float32)
    y = gather_conv(x, w, rel, schedule="random", seed=2)
    out, inp, k = edges(rel)
    check(y, ref_conv(x, w, out, inp, k, rel.n_out), "float32")


def test_rows_without_edges_are_zero():
    rng = np.random.default_rng(8)
    coords = make_coords(rng, 40, batches=1)
    far = np.array([[0, 100, 100, 100], [1, 0, 0, 0], [0, -50, 3, 3]], np.int32)
    rel = submanifold(coords, np.concatenate([far, coords[:5]]))
    off = np.array(rel.out_offsets)
    assert (np.diff(off)[:3] == 0).all() and (np.diff(off)[3:] > 0).all()
    x = rng.standard_normal((len(coords), 3)).astype(np.float32)
    w = rng.standard_normal((27, 3, 2)).astype(np.float32)
    y = gather_conv(x, w, rel)
    np.testing.assert_array_equal(y[:3], 0)
    out, inp, k = edges(rel)
    check(y, ref_conv(x, w, out, inp, k, rel.n_out), "float32")


def test_relation_without_any_edge():
    rng = np.random.default_rng(9)
    coords = make_coords(rng, 20, batches=1)
    rel = submanifold(coords, np.array([[0, 90, 90, 90], [0, 95, 90, 90]], np.int32))
    assert rel.edges == 0
    x = rng.standard_normal((len(coords), 2)).astype(np.float16)
    w = rng.standard_normal((27, 2, 5)).astype(np.float16)
    y = gather_conv(x, w, rel, schedule="reverse")
    np.testing.assert_array_equal(y, 0)


@pytest.mark.parametrize("dt,schedule", [("float32", "forward"), ("float16", "random")])
def test_gather_conv_pointwise(dt, schedule):
    rng = np.random.default_rng(10)
    x = rng.standard_normal((45, 7)).astype(DTYPES[dt])
    w = rng.standard_normal((1, 7, 33)).astype(DTYPES[dt])
    y = gather_conv(x, w, None, schedule=schedule)
    check(y, x.astype(np.float64) @ w[0].astype(np.float64), dt)


# ---------------------------------------------------------------- weight_grad


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("a,b,schedule", [(1, 1, "reverse"), (7, 33, "random"), (33, 7, "forward")])
def test_weight_grad_submanifold(dt, a, b, schedule):
    rng = np.random.default_rng(a + 7 * b)
    rel = submanifold(make_coords(rng, 120))
    x = rng.standard_normal((rel.n_in, a)).astype(DTYPES[dt])
    ct = (rng.standard_normal((rel.n_out, b)) / 4).astype(DTYPES[dt])
    dw = weight_grad(x, ct, rel, 27, schedule=schedule)
    out, inp, k = edges(rel)
    check(dw, ref_weight_grad(x, ct, inp, out, k, 27), dt)


def test_weight_grad_input_major_view():
    rng = np.random.default_rng(12)
    rel = strided(make_coords(rng, 150))
    x = rng.standard_normal((rel.n_out, 6)).astype(np.float32)
    ct = rng.standard_normal((rel.n_in, 35)).astype(np.float32)
    dw = weight_grad(x, ct, rel, rel.kernel_volume, view=metal_programs.INPUT_MAJOR, schedule="random")
    out, inp, k = edges(rel)
    check(dw, ref_weight_grad(x, ct, out, inp, k, rel.kernel_volume), "float32")


@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_weight_grad_pointwise(dt):
    rng = np.random.default_rng(13)
    x = rng.standard_normal((37, 9)).astype(DTYPES[dt])
    ct = (rng.standard_normal((37, 40)) / 4).astype(DTYPES[dt])
    dw = weight_grad(x, ct, None, 1, schedule="reverse")
    check(dw, (x.astype(np.float64).T @ ct.astype(np.float64))[None], dt)


# ---------------------------------------------------------------- programs


def test_programs_bind_the_views_and_params_the_kernels_read():
    """What the runs above execute: the relation-traversal and weight-gradient
    programs, with the buffers, dispatch shapes and params of fetch_on_demand.metal."""
    rng = np.random.default_rng(14)
    rel = submanifold(make_coords(rng, 50))
    for dt, mdt in (("float32", mx.float32), ("float16", mx.float16)):
        x = mx.array(rng.standard_normal((rel.n_out, 7))).astype(mdt)
        w = mx.array(rng.standard_normal((27, 7, 33))).astype(mdt)
        inputs = _ext.conv_inputs(x, w, rel, metal_programs.OUTPUT_MAJOR, CONV_ROUTE)
        _, offsets, gather, kidx = csr_arrays(rel, metal_programs.OUTPUT_MAJOR)
        for got, want in zip(inputs[2:5], (offsets, gather, kidx)):
            np.testing.assert_array_equal(np.array(got), want)
        prog = _ext.metal_program("conv", CONV_ROUTE, inputs, [rel.n_out, 33], mdt)
        assert prog["temps"] == []
        (step,) = prog["steps"]
        # one thread per (row, output channel): 32 channels x 8 rows per group
        assert step["kernel"] == f"fetch_on_demand_{dt}"
        assert tuple(step["threads"]) == (32, 8, 1)
        assert tuple(step["groups"]) == (2, -(-rel.n_out // 8), 1)
        kinds = [(kind, payload if kind != "bytes" else None) for kind, payload, _ in step["buffers"]]
        assert kinds == [("input", 0), ("input", 1), ("input", 2), ("input", 3), ("input", 4),
                         ("output", 0), ("bytes", None)]
        assert [nm for _, _, nm in step["buffers"]] == ["x", "w", "offsets", "gather", "k", "y", "params"]
        # ConvParams (metal/params.h): rows, a, b, pointwise, k, n_in, n_tiles, edges
        params = np.frombuffer(step["buffers"][-1][1], np.int32).tolist()
        assert params == [rel.n_out, 7, 33, 0, 27, rel.n_out, 0, rel.edges]

        # pointwise: x stands in for the index buffers, which are never read
        xp = x[:20]
        pinputs = _ext.conv_inputs(xp, w[:1], None, metal_programs.OUTPUT_MAJOR, CONV_ROUTE)
        (pstep,) = _ext.metal_program("conv", CONV_ROUTE, pinputs, [20, 33], mdt)["steps"]
        assert [(k, v) for k, v, _ in pstep["buffers"][:5]] == [("input", 0), ("input", 1)] + [("input", 0)] * 3
        assert np.frombuffer(pstep["buffers"][-1][1], np.int32).tolist()[:4] == [20, 7, 33, 1]

        ct = mx.array(rng.standard_normal((rel.n_out, 33))).astype(mdt)
        ginputs = _ext.weight_grad_inputs(x, ct, rel, metal_programs.OUTPUT_MAJOR)
        prog = _ext.metal_program("weight_grad", GRAD_ROUTE, ginputs, [27, 7, 33], mdt)
        (step,) = prog["steps"]
        # one thread per (offset, input channel, output channel)
        assert step["kernel"] == f"wgrad_direct_{dt}"
        assert (tuple(step["groups"]), tuple(step["threads"])) == ((2, 1, 27), (32, 8, 1))
        assert [nm for _, _, nm in step["buffers"]] == ["x", "ct", "offsets", "g", "r", "dw", "params"]
        assert np.frombuffer(step["buffers"][-1][1], np.int32).tolist() == [27, 7, 33, -1]


def test_this_file_covers_every_kernel_of_fetch_on_demand_metal():
    if BACKEND != "metal-harness":
        pytest.skip("lists kernels with the harness's source scanner")
    defined = {k for k, path in mh.defined_kernels().items() if path.name == "fetch_on_demand.metal"}
    assert defined == set(KERNELS), f"kernels without a test here: {sorted(defined - set(KERNELS))}"
