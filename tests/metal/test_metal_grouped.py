"""Grouped and depthwise Metal routes (metal/grouped.metal): selection, and
each kernel's program run through the harness against the per-group oracle,
in float32, float16 and bfloat16. Covers every kernel of grouped.metal.
Groups of >= 8 channels select the matrix-unit routes
(test_metal_grouped_mma.py); these scalar routes stay reachable by name."""

import numpy as np
import pytest
import mlx.core as mx

from mlx_lattice import routes
from mlx_lattice.layout import mapped_weight
from mlx_lattice.routes import RouteContext

import metal_harness as mh
import metal_programs
import oracle
from conftest import METAL_TOLERANCES
from metal_programs import BACKEND, INPUT_MAJOR

pytestmark = metal_programs.MARKS

KERNELS = tuple(f"grouped_{fn}_{dt}" for fn in ("fetch_on_demand", "wgrad")
                for dt in ("float32", "float16", "bfloat16"))
DTYPES = [mx.float32, mx.float16, mx.bfloat16]
# bfloat16: float sums of the rounded operands, rounded once (2^-8).
TOL = {**METAL_TOLERANCES, mx.bfloat16: dict(rtol=2.0**-7, atol=1e-3)}
FORWARD = "metal.grouped_fetch_on_demand"
WGRAD = "metal.grouped_wgrad"
# (C_in, C_out, groups): grouped, depthwise, depthwise with multiplier 2,
# awkward and wide depthwise counts.
CHANNELS = [(12, 8, 4), (3, 3, 3), (3, 6, 3), (17, 17, 17), (40, 40, 40)]


def grouped_case(rng, n, c_in, c_out, groups, dtype, kind):
    """Features, grouped 5D weight (C_out, k, k, k, C_in / groups), relation,
    oracle edges, output rows."""
    feats, w5, rel, edges, n_out = metal_programs.case(rng, n, c_in, c_out, dtype, kind)
    ks = w5.shape[1]
    wg = rng.standard_normal((c_out, ks, ks, ks, c_in // groups)) / np.sqrt(ks ** 3 * c_in // groups)
    return feats, mx.array(wg.astype(np.float32)).astype(dtype), rel, edges, n_out


def f64(a):
    return np.array(a.astype(mx.float32)).astype(np.float64)


@pytest.mark.parametrize("backend", ["metal"])
@pytest.mark.parametrize("direction,route", [("forward", FORWARD), ("dgrad", FORWARD), ("wgrad", WGRAD)])
def test_selection(backend, direction, route):
    base = dict(op="conv3d", map_kind="submanifold", dtype="float32", backend=backend,
                kernel_size=(3, 3, 3), tier="metal:test", c_in=16, c_out=16, direction=direction)
    assert routes.select(RouteContext(groups=4, **base)).route.name == route
    assert routes.select(RouteContext(groups=1, **base)).route.name != route
    # bfloat16 stays on the GPU
    sel = routes.select(RouteContext(groups=4, **{**base, "dtype": "bfloat16"}))
    assert sel.route.name == route and sel.fallback is None
    # groups of 8 channels and more take the matrix units
    wide = routes.select(RouteContext(groups=2, **base)).route
    assert wide.matrix_unit and wide.grouped and wide.priority > routes.get(route).priority


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c_in,c_out,groups", CHANNELS)
@pytest.mark.parametrize("kind", ["submanifold", "forward", "pointwise"])
def test_forward(rng, dtype, c_in, c_out, groups, kind):
    feats, w5, rel, edges, n_out = grouped_case(rng, 90, c_in, c_out, groups, dtype, kind)
    relation = None if kind == "pointwise" else rel._native
    y = metal_programs.conv(FORWARD, feats, mapped_weight(w5), relation, groups=groups)
    expected = oracle.apply(edges, f64(feats), oracle.expand_grouped(f64(w5), groups), n_out)
    np.testing.assert_allclose(y.astype(np.float64), expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c_in,c_out,groups", CHANNELS)
def test_input_gradient(rng, dtype, c_in, c_out, groups):
    """The input gradient: the same kernel over the input-major view with the
    grouped weight transposed per group."""
    feats, w5, rel, edges, n_out = grouped_case(rng, 90, c_in, c_out, groups, dtype, "forward")
    ct = rng.standard_normal((n_out, c_out)).astype(np.float32)
    w = np.array(mapped_weight(w5).astype(mx.float32))  # (K, C_in / G, C_out)
    k, ag, bg = w.shape[0], c_in // groups, c_out // groups
    wt = w.reshape(k, ag, groups, bg).transpose(0, 3, 2, 1).reshape(k, bg, c_in)
    ct = mx.array(ct).astype(dtype)
    dx = metal_programs.conv(FORWARD, ct, mx.array(wt).astype(dtype), rel._native, view=INPUT_MAJOR, groups=groups)
    ex, _, _ = oracle.grads(edges, f64(feats), oracle.expand_grouped(f64(w5), groups), f64(ct))
    np.testing.assert_allclose(dx.astype(np.float64), ex, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c_in,c_out,groups", CHANNELS)
@pytest.mark.parametrize("kind", ["forward", "pointwise"])
def test_weight_gradient(rng, dtype, c_in, c_out, groups, kind):
    feats, w5, rel, edges, n_out = grouped_case(rng, 90, c_in, c_out, groups, dtype, kind)
    ct = mx.array(rng.standard_normal((n_out, c_out)).astype(np.float32)).astype(dtype)
    relation = None if kind == "pointwise" else rel._native
    k = 1 if kind == "pointwise" else 27
    dw = metal_programs.weight_grad(WGRAD, feats, ct, relation, k, groups=groups)
    _, ew, _ = oracle.grads(edges, f64(feats), oracle.expand_grouped(f64(w5), groups), f64(ct))
    expected = np.array(mapped_weight(mx.array(oracle.compress_grouped(ew, groups).astype(np.float32))))
    np.testing.assert_allclose(dw.astype(np.float64), expected, **TOL[dtype])


def test_programs(rng):
    feats, w5, rel, edges, n_out = grouped_case(rng, 40, 12, 8, 4, mx.float32, "submanifold")
    from mlx_lattice import _ext
    inputs = _ext.conv_inputs(feats, mapped_weight(w5), rel._native, _ext.View.output_major, FORWARD, groups=4)
    prog = _ext.metal_program("conv", FORWARD, inputs, [n_out, 8], mx.float32, groups=4)
    (step,) = prog["steps"]
    assert step["kernel"] == "grouped_fetch_on_demand_float32"
    assert [nm for _, _, nm in step["buffers"]] == ["x", "w", "offsets", "gather", "k", "y", "params"]
    assert np.frombuffer(step["buffers"][-1][1], np.int32).tolist() == [n_out, 12, 8, 3, 2, -1]
    with pytest.raises(ValueError, match="grouped route"):
        _ext.conv_inputs(feats, mapped_weight(w5), rel._native, _ext.View.output_major, "metal.fetch_on_demand",
                         groups=4)
    winputs = _ext.weight_grad_inputs(feats, mx.zeros((n_out, 8)), rel._native, _ext.View.output_major)
    wprog = _ext.metal_program("weight_grad", WGRAD, winputs, [27, 3, 8], mx.float32, groups=4)
    (wstep,) = wprog["steps"]
    assert wstep["kernel"] == "grouped_wgrad_float32"
    assert np.frombuffer(wstep["buffers"][-1][1], np.int32).tolist() == [27, 12, 8, 3, 2, -1]
    # the group count is the primitive's, and the shapes must hold it
    for shape, groups in (([27, 5, 8], 4), ([27, 3, 8], 3), ([27, 3, 8], 1)):
        with pytest.raises(ValueError, match="grouped_wgrad needs the weight's input channels times the group"):
            _ext.metal_program("weight_grad", WGRAD, winputs, shape, mx.float32, groups=groups)


def test_this_file_covers_every_kernel_of_grouped_metal():
    if BACKEND != "metal-harness":
        pytest.skip("lists kernels with the harness's source scanner")
    defined = {k for k, path in mh.defined_kernels().items() if path.name == "grouped.metal"}
    assert defined == set(KERNELS), f"kernels without a test here: {sorted(defined - set(KERNELS))}"
