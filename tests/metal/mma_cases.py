"""What the matrix-unit tests share (test_metal_csr_mma.py and its
TensorOps twin, test_metal_grouped_mma.py, test_metal_dense_mma.py,
test_metal_wgrad_mma.py and its TensorOps twin): operands, float64 sums
over the oracle's edges (tests/oracle.py) for the product and for the weight
gradient, tolerances against them, relations without edges, running a
route's program and the thread schedules that must give the same bits.
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
from metal_programs import OUTPUT_MAJOR, geometry

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
# Against float64 sums of the same (rounded) operands: float32 accumulation,
# then one rounding to the output dtype (half an ulp: 2^-11 / 2^-8 relative).
TOL = {
    mx.float32: dict(rtol=1e-5, atol=1e-5),
    mx.float16: dict(rtol=2.0**-10, atol=1e-4),
    mx.bfloat16: dict(rtol=2.0**-7, atol=1e-4),
}
# Weight gradients: float sums of up to a few hundred products, rounded once
# to the dtype.
WTOL = {
    mx.float32: dict(rtol=1e-5, atol=1e-5),
    mx.float16: dict(rtol=2.0**-10, atol=1e-3),
    mx.bfloat16: dict(rtol=2.0**-7, atol=1e-3),
}
# (schedule, seed) of the runs that must agree bit for bit.
SCHEDULES = (("forward", 0), ("reverse", 0), ("random", 1), ("random", 2))

# ------------------------------------------------------------------ cases
# (kind, ks, C_in, C_out, dtype, schedule) of the ungrouped products: every
# kernel (dtype x column block) and every map kind; channels not multiples
# of 8 or of the block.
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
]
# (kind, ks, C_in, C_out, dtype) of the ungrouped input gradients.
INPUT_GRADIENT = [
    ("submanifold", 3, 24, 40, "float32"),
    ("forward", 2, 40, 24, "bfloat16"),
    ("target", 3, 8, 96, "float16"),
    ("transposed", 2, 33, 17, "bfloat16"),
    ("generative", 3, 16, 16, "float32"),
    ("submanifold", 5, 12, 20, "float16"),
]
# (kind, ks, C_in, C_out, dtype, schedule) of the ungrouped weight
# gradients: both kernels of each dtype, every map kind.
WEIGHT_GRADIENT = [
    ("submanifold", 3, 8, 8, "float32", "forward"),
    ("forward", 3, 24, 40, "float16", "random"),
    ("target", 3, 40, 24, "bfloat16", "reverse"),
    ("transposed", 2, 96, 128, "float32", "random"),
    ("generative", 3, 128, 96, "float16", "forward"),
    ("submanifold", 3, 13, 70, "bfloat16", "random"),
    ("forward", 2, 33, 17, "float32", "reverse"),
    ("target", 3, 8, 8, "float16", "reverse"),
    ("generative", 3, 24, 40, "bfloat16", "forward"),
]


# ------------------------------------------------------------------ operands
def f64(a: mx.array) -> np.ndarray:
    """An array's values as float64 (through float32: exact for every dtype here)."""
    return np.array(a.astype(mx.float32)).astype(np.float64)


def features(rng, rows, c, dtype, scale=1.0):
    """Standard normal (rows, c) features of dtype, times `scale`."""
    return mx.array((rng.standard_normal((rows, c)) * scale).astype(np.float32)).astype(dtype)


def weight(rng, k, c_in, c_out, dtype):
    """A kernel-major weight (K, C_in, C_out) of dtype (C_in: a group's
    input channels for a grouped one), scaled so that outputs are O(1)."""
    w = rng.standard_normal((k, c_in, c_out)) / np.sqrt(max(c_in, 1) * min(k, 9))
    return mx.array(w.astype(np.float32)).astype(dtype)


def operands(rng, rows, c_in, c_out, k, dtype):
    """x (rows, C_in) and a kernel-major weight (K, C_in, C_out) of dtype."""
    x = features(rng, rows, c_in, dtype)
    return x, weight(rng, k, c_in, c_out, dtype)


def wgrad_operands(rng, rows_in, rows_out, c_in, c_out, dtype, ct_scale=0.25):
    """x (rows_in, C_in) and a cotangent (rows_out, C_out) scaled by `ct_scale`."""
    return features(rng, rows_in, c_in, dtype), features(rng, rows_out, c_out, dtype, ct_scale)


# ------------------------------------------------------------------ references
def reference(edges, x, w, rows, transpose=False, groups=1):
    """y[o, group j] += x[i, group j] @ W[k][:, group j] over the edges (o, i,
    k), float64, grouped by offset; with `transpose`, the input gradient:
    dx[i, group j] += ct[o, group j] @ W[k][:, group j]^T."""
    x, w = f64(x), f64(w)
    ag, bg = w.shape[1], w.shape[2] // groups
    src_c, dst_c = (bg, ag) if transpose else (ag, bg)
    y = np.zeros((rows, dst_c * groups))
    o, i, k = edges[:, 0], edges[:, 1], edges[:, 2]
    dst, src = (i, o) if transpose else (o, i)
    for kk in np.unique(k):
        sel = k == kk
        for j in range(groups):
            wk = w[kk][:, j * bg:(j + 1) * bg]
            part = x[src[sel], j * src_c:(j + 1) * src_c] @ (wk.T if transpose else wk)
            np.add.at(y[:, j * dst_c:(j + 1) * dst_c], dst[sel], part)
    return y


def wgrad_reference(edges, x, ct, k, groups=1):
    """dW[k][:, group j] = sum over offset k's edges (o, i, k) of
    x[i, group j]^T ct[o, group j], float64."""
    x, ct = f64(x), f64(ct)
    ag, bg = x.shape[1] // groups, ct.shape[1] // groups
    dw = np.zeros((k, ag, ct.shape[1]))
    o, i, kk = edges[:, 0], edges[:, 1], edges[:, 2]
    for m in np.unique(kk):
        sel = kk == m
        for j in range(groups):
            dw[m][:, j * bg:(j + 1) * bg] = x[i[sel], j * ag:(j + 1) * ag].T @ ct[o[sel], j * bg:(j + 1) * bg]
    return dw


def check(y, expected, tol, what="outputs"):
    """No element left unwritten (NaN), and y within `tol` of `expected`."""
    assert not np.isnan(y).any(), f"{what} left unwritten"
    np.testing.assert_allclose(y.astype(np.float64), expected, **tol)


# ------------------------------------------------------------------ programs
def _native(rel):
    return None if rel is None else getattr(rel, "_native", rel)


def conv(x, w, rel, view=OUTPUT_MAJOR, schedule="forward", seed=0, *, route, groups=1):
    """`route`'s product over `rel` (a Relation, its native one, or None)."""
    return metal_programs.conv(route, x, w, _native(rel), view, schedule=schedule, seed=seed, groups=groups)


def wgrad(x, ct, rel, k, schedule="forward", seed=0, *, route, groups=1):
    """`route`'s weight gradient over `rel` (a Relation, its native one, or None)."""
    return metal_programs.weight_grad(route, x, ct, _native(rel), k, schedule=schedule, seed=seed, groups=groups)


def wgrad_program(route, x, ct, native, k, dtype):
    """`route`'s weight-gradient program over the output-major view."""
    inputs = _ext.weight_grad_inputs(x, ct, native, OUTPUT_MAJOR)
    return _ext.metal_program("weight_grad", route, inputs, [k, x.shape[1], ct.shape[1]], dtype)


def same_bits(run, schedules=SCHEDULES):
    """run(schedule, seed) for each schedule: the same bytes every time; the first run."""
    runs = [run(s, seed) for s, seed in schedules]
    for y in runs[1:]:
        assert y.tobytes() == runs[0].tobytes()
    return runs[0]


# ------------------------------------------------------------------ relations
FAR = np.array([[0, 90, 90, 90], [0, 95, 90, 90], [0, 99, 99, 99]], np.int32)


def tensor(rng, n, extent):
    """Random coordinates (one batch) and a one-channel SparseTensor on them."""
    coords = oracle.random_coords(rng, n, extent, 1)
    return coords, ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32))


def target_relation(s, out):
    """The 3x3x3 relation from s's coordinates onto the output coordinates `out`."""
    m = s.manager
    return m.target_kernel_relation(s.coordinate_set, m.register(mx.array(out)), geometry(3, 1, 1))


def edgeless(rng, n):
    """Coordinates, their SparseTensor and a relation onto FAR, too far for any edge."""
    coords, s = tensor(rng, n, 6)
    rel = target_relation(s, FAR)
    assert rel.edges == 0
    return coords, s, rel


def edgeless_native():
    """A native target relation of one output far from both inputs: no edges."""
    coords = np.array([[0, 0, 0, 0], [0, 1, 1, 1]], np.int32)
    native = _ext.build_relation(_ext.CoordTable(mx.array(coords)), mx.array(np.array([[0, 50, 50, 50]], np.int32)),
                                 (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), False, "target")
    assert native.edges == 0
    return native


def reversed_rows(rel, rows_in, n_out):
    """rel's CSR (submanifold, K 27) with each output row's edges in reverse order."""
    off = np.array(rel.out_offsets)
    gather, kidx = np.array(rel.in_idx).copy(), np.array(rel.k_idx).copy()
    for r in range(n_out):
        gather[off[r]:off[r + 1]] = gather[off[r]:off[r + 1]][::-1]
        kidx[off[r]:off[r + 1]] = kidx[off[r]:off[r + 1]][::-1]
    return _ext.Relation("submanifold", rows_in, n_out, 27, mx.array(off), mx.array(gather), mx.array(kidx))


# ------------------------------------------------------------------ selection and coverage
def conv_ctx(direction="forward", **kw):
    """A Metal convolution's RouteContext, submanifold 3x3x3 float32 unless `kw` says."""
    base = dict(op="conv3d", map_kind="submanifold", dtype="float32", backend="metal",
                kernel_size=(3, 3, 3), tier="metal:test", direction=direction)
    base.update(kw)
    return RouteContext(**base)


def wgrad_ctx(**kw):
    """A Metal weight gradient's RouteContext, submanifold K 27 float32 unless `kw` says."""
    base = dict(op="wgrad of test", map_kind="submanifold", dtype="float32", backend="metal",
                kernel_size=None, k=27, tier="metal:test", direction="wgrad")
    base.update(kw)
    return RouteContext(**base)


def assert_tensorops_tiers(record, route, twin):
    """The Mac plan's tiers: `route` on M5 (Apple10, macOS 26.2), its twin on
    M3 / M4, and counted as matrix-unit work."""
    assert routes.select(mac_plan.mac_context(record, "m5")).route.name == route
    for tier in ("m3", "m4"):
        assert routes.select(mac_plan.mac_context(record, tier)).route.name == twin
    p = mac_plan.plan([record], "m5")
    assert p["routes"][route]["kind"] == "matrix" and p["share"]["matrix"] == 1.0
    assert not diagnostics.metal_capabilities("applegpu_g17s", "26.1")["tensor_ops"]


def kernels_of(filename):
    """The kernels the harness's source scanner finds in metal/`filename`
    (the test skips elsewhere)."""
    if metal_programs.BACKEND != "metal-harness":
        pytest.skip("lists kernels with the harness's source scanner")
    return {k for k, path in mh.defined_kernels().items() if path.name == filename}


# ------------------------------------------------------------------ one case
def conv_case(rng, run, kind, ks, c_in, c_out, dtype, n=150, **run_kw):
    """A relation of `kind`, operands on it and run(x, w, rel, **run_kw):
    (x, w, rel, y, the float64 reference)."""
    rel, rows_in, n_out, edges = metal_programs.relation(rng, kind, n, ks)
    x, w = operands(rng, rows_in, c_in, c_out, rel.kernel_volume, dtype)
    y = run(x, w, rel, **run_kw)
    return x, w, rel, y, reference(edges, x, w, n_out)


def dgrad_case(rng, run, kind, ks, c_in, c_out, dtype, n=150, **run_kw):
    """The input gradient of a relation of `kind`: ct @ W[k]^T over the
    input-major view, as autodiff builds it (src/core/primitives.cpp):
    (ct, W transposed per offset, rel, dx, the float64 reference)."""
    rel, rows_in, n_out, edges = metal_programs.relation(rng, kind, n, ks)
    _, w = operands(rng, rows_in, c_in, c_out, rel.kernel_volume, dtype)
    ct = features(rng, n_out, c_out, dtype)
    wt = mx.swapaxes(w, 1, 2)
    dx = run(ct, wt, rel, view=metal_programs.INPUT_MAJOR, **run_kw)
    assert dx.shape == (rows_in, c_in)
    return ct, wt, rel, dx, reference(edges, ct, w, rows_in, transpose=True)


def wgrad_case(rng, run, kind, ks, c_in, c_out, dtype, n=150, **run_kw):
    """A relation of `kind`, x and ct on it and run(x, ct, rel, K, **run_kw):
    (x, ct, rel, dW, the float64 reference)."""
    rel, rows_in, n_out, edges = metal_programs.relation(rng, kind, n, ks)
    x, ct = wgrad_operands(rng, rows_in, n_out, c_in, c_out, dtype)
    dw = run(x, ct, rel, rel.kernel_volume, **run_kw)
    return x, ct, rel, dw, wgrad_reference(edges, x, ct, rel.kernel_volume)
