"""metal/norm_act.metal: the NormAct / NormActGrad programs against a float64
NumPy oracle written here and against the CPU primitive.

The programs come from _ext.metal_norm_program (what eval_gpu encodes) and
run on the primitive's own inputs: on Linux step by step through the CPU
harness, on a Mac as the primitives themselves on the GPU. Forward: y, the
batch mean and biased variance; backward: dx, dweight, dbias and the
residual's gradient, given cotangents of y, mean and var. Cases: float32 /
float16 / bfloat16, batch norm, instance norm with the rows of batch items
interleaved, eval mode (given statistics), every activation, with and
without a residual, N = 0 and 1, C = 3, 33, 65 (several channel tiles),
several row blocks, more blocks than merge threads, more segments than a
block holds by default, an empty segment, and means far above the spread.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np
import pytest

from mlx_lattice import _ext, backends, routes
from mlx_lattice.nn.normalization import fused_norms
from mlx_lattice.nn import normalization

import metal_harness
import metal_programs
from metal_programs import BACKEND, buffer, fresh, from_buffer, run_steps

pytestmark = metal_programs.MARKS

TYPED = ("stats", "apply", "grad_sums", "grad_apply")
KERNELS = tuple(
    f"norm_act_{k}_{t}" for k in TYPED for t in ("float32", "float16", "bfloat16")
) + ("norm_act_merge", "norm_act_grad_merge")
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
ACTS = {"none": (0, 0.0), "relu": (1, 0.0), "leaky": (2, 0.2)}
LOW = {"none": 1.0, "relu": 0.0, "leaky": 0.2}  # y = z > 0 ? z : low * z
EPS = 1e-5
# Outputs in T against float64 (about one rounding of T; float32 sums).
TOL = {mx.float32: 2e-5, mx.float16: 2e-3, mx.bfloat16: 1.6e-2}


@dataclass
class Case:
    x: mx.array                    # (N, C) features, dtype T
    w: mx.array                    # (C,) float32
    b: mx.array
    r: mx.array | None             # residual (N, C), dtype T
    seg: mx.array | None           # (N,) int32 segment ids
    segments: int
    stats: tuple | None            # given (mean, var), (C,) float32: eval mode
    act: str

    @property
    def training(self) -> bool:
        return self.stats is None

    @property
    def dtype(self):
        return self.x.dtype

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.x.shape)


def make_case(rng, n, c, dtype=mx.float32, kind="batch", act="relu", residual=False, items=3,
              offset=0.0, centres=1.0, spread=2.0, ids=None) -> Case:
    """kind: batch (training), instance (segment ids `ids`, by default random
    in [0, items): rows of an item interleaved) or eval (given statistics).
    Channel c has mean about offset + centres * N(0, 1) and spread `spread`."""
    x = rng.standard_normal((n, c)) * spread + rng.standard_normal(c) * centres + offset
    w = rng.uniform(0.5, 1.5, c).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    r = mx.array(rng.standard_normal((n, c)).astype(np.float32)).astype(dtype) if residual else None
    seg, segments, stats = None, 1, None
    if kind == "instance":
        segments = items
        seg = mx.array((rng.integers(0, items, n) if ids is None else ids).astype(np.int32))
    elif kind == "eval":
        stats = (mx.array(rng.standard_normal(c).astype(np.float32)),
                 mx.array(rng.uniform(0.5, 4.0, c).astype(np.float32)))
    else:
        assert kind == "batch", kind
    return Case(mx.array(x.astype(np.float32)).astype(dtype), mx.array(w), mx.array(b), r, seg, segments,
                stats, act)


def f64(a) -> np.ndarray:
    return np.array(mx.array(a).astype(mx.float32)).astype(np.float64)


# ------------------------------------------------------------------ oracle

def groups(case: Case) -> np.ndarray:
    n = case.shape[0]
    return np.zeros(n, np.int64) if case.seg is None else np.array(case.seg).astype(np.int64)


def oracle_stats(case: Case):
    """Per-segment mean and biased variance (S, C), 0 and 0 where empty."""
    x, g = f64(case.x), groups(case)
    c = case.shape[1]
    mean = np.zeros((case.segments, c))
    var = np.zeros((case.segments, c))
    for s in range(case.segments):
        rows = x[g == s]
        if len(rows):
            mean[s], var[s] = rows.mean(0), rows.var(0)
    return mean, var


def oracle_forward(case: Case):
    """(y, mean, var, z): z the pre-activation."""
    x, g = f64(case.x), groups(case)
    if case.training:
        mean, var = oracle_stats(case)
    else:
        mean, var = f64(case.stats[0])[None], f64(case.stats[1])[None]
    z = (x - mean[g]) / np.sqrt(var[g] + EPS) * f64(case.w) + f64(case.b)
    if case.r is not None:
        z = z + f64(case.r)
    return np.where(z > 0, z, LOW[case.act] * z), mean, var, z


def oracle_backward(case: Case, ct, ct_mean, ct_var, stats=None):
    """(dx, dweight, dbias, g) from the closed form in float64; `stats`: the
    (S, C) mean and var to take instead of the batch's (act' still from the
    exact z)."""
    x, grp = f64(case.x), groups(case)
    _, mean, var, z = oracle_forward(case)
    if stats is not None:
        mean, var = f64(stats[0]), f64(stats[1])
    g = np.where(z > 0, 1.0, LOW[case.act]) * f64(ct)
    inv = 1.0 / np.sqrt(var + EPS)
    xhat = (x - mean[grp]) * inv[grp]
    w = f64(case.w)
    if not case.training:
        dx = w * inv[grp] * g
    else:
        counts = np.bincount(grp, minlength=case.segments).astype(np.float64)[:, None]
        rn = np.where(counts > 0, 1.0 / np.maximum(counts, 1), 0.0)
        a = np.zeros_like(mean)
        bsum = np.zeros_like(mean)
        np.add.at(a, grp, g)
        np.add.at(bsum, grp, g * xhat)
        dx = (w * inv[grp] * (g - (a * rn)[grp] - xhat * (bsum * rn)[grp])
              + (f64(ct_mean) * rn)[grp] + 2.0 * (f64(ct_var) * rn)[grp] * (x - mean[grp]))
    return dx, (g * xhat).sum(0), g.sum(0), g


# ------------------------------------------------------------------ runs

def primitive(case: Case, stream):
    """The NormAct primitive's outputs on `stream` (the CPU reference, or a
    Mac's GPU)."""
    code, slope = ACTS[case.act]
    mean, var = case.stats if case.stats is not None else (None, None)
    return _ext.norm_act(case.x, case.w, case.b, case.r, case.seg, case.segments, mean, var, EPS, code, slope,
                         stream=stream)


def primitive_grads(case: Case, ct, ct_mean, ct_var, stream):
    """(dx, dweight, dbias[, dresidual]) of the primitive through its VJP
    (the NormActGrad primitive) on `stream`."""
    code, slope = ACTS[case.act]
    mean, var = case.stats if case.stats is not None else (None, None)

    def f(x, w, b, *r):
        return _ext.norm_act(x, w, b, r[0] if r else None, case.seg, case.segments, mean, var, EPS, code, slope,
                             stream=stream)

    primals = [case.x, case.w, case.b] + ([case.r] if case.r is not None else [])
    cts = [ct] + ([ct_mean, ct_var] if case.training else [])
    _, grads = mx.vjp(f, primals, cts)
    return grads


def program(case: Case, direction: str) -> dict:
    code, slope = ACTS[case.act]
    n, c = case.shape
    return _ext.metal_norm_program(direction, n, c, case.dtype, case.segments, case.seg is not None,
                                   case.training, case.r is not None, code, slope, EPS)


def record_gpu(prog: dict) -> None:
    """Kernel coverage of a run on a Mac's GPU (harness runs record their own)."""
    for step in prog["steps"]:
        metal_harness.record_ran(step["kernel"], "metal")


def metal_forward(case: Case, schedule="forward", seed=0) -> list[mx.array]:
    """[y, mean, var] (training) or [y] of the forward program."""
    prog = program(case, "forward")
    n, c = case.shape
    if BACKEND == "metal":
        record_gpu(prog)
        return list(primitive(case, mx.default_stream(mx.gpu)))
    inputs = [case.x, case.w, case.b]
    if not case.training:
        inputs += [case.stats[0].reshape(1, c), case.stats[1].reshape(1, c)]
    inputs += [a for a in (case.r, case.seg) if a is not None]
    outs = [fresh((n, c), case.dtype)]
    if case.training:
        outs += [fresh((case.segments, c), mx.float32), fresh((case.segments, c), mx.float32)]
    temps = [fresh(size, mx.float32) for _, size in prog["temps"]]
    got = run_steps(prog, [buffer(a) for a in inputs], outs, temps, schedule, seed)
    return [from_buffer(got[0], case.dtype)] + [mx.array(a) for a in got[1:]]


def metal_backward(case: Case, ct, ct_mean, ct_var, schedule="forward", seed=0) -> list[mx.array]:
    """[dx, dweight, dbias[, dresidual]] of the backward program, whose
    inputs (y, mean, var) are the CPU primitive's forward outputs, as the
    VJP hands them to NormActGrad."""
    prog = program(case, "backward")
    n, c = case.shape
    if BACKEND == "metal":
        record_gpu(prog)
        return list(primitive_grads(case, ct, ct_mean, ct_var, mx.default_stream(mx.gpu)))
    fwd = primitive(case, mx.default_stream(mx.cpu))
    if case.training:
        mean, var = fwd[1], fwd[2]
    else:
        mean, var = case.stats[0].reshape(1, c), case.stats[1].reshape(1, c)
    inputs = [case.x, fwd[0], ct, case.w, case.b, mean, var]
    inputs += [case.seg] if case.seg is not None else []
    inputs += [ct_mean, ct_var] if case.training else []
    outs = [fresh((n, c), case.dtype), fresh((c,), mx.float32), fresh((c,), mx.float32)]
    if case.r is not None:
        outs.append(fresh((n, c), case.dtype))
    temps = [fresh(size, mx.float32) for _, size in prog["temps"]]
    got = run_steps(prog, [buffer(a) for a in inputs], outs, temps, schedule, seed)
    return [from_buffer(got[0], case.dtype), mx.array(got[1]), mx.array(got[2])] + (
        [from_buffer(got[3], case.dtype)] if case.r is not None else [])


def cotangents(rng, case: Case):
    n, c = case.shape
    ct = mx.array(rng.standard_normal((n, c)).astype(np.float32)).astype(case.dtype)
    ct_mean = mx.array(rng.standard_normal((case.segments, c)).astype(np.float32))
    ct_var = mx.array(rng.standard_normal((case.segments, c)).astype(np.float32))
    return ct, ct_mean, ct_var


# ------------------------------------------------------------------ checks

def close(got, want, tol, scale=None, what=""):
    """|got - want| <= tol * (|want| + scale) elementwise; scale (broadcast)
    defaults to max(1, max |want|)."""
    got, want = f64(got), np.asarray(want, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if scale is None:
        scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    err = np.abs(got - want)
    bound = tol * (np.abs(want) + scale)
    if not (err <= bound).all():
        i = np.unravel_index(np.argmax(err - bound), err.shape)
        raise AssertionError(
            f"{what}: {int((err > bound).sum())} of {err.size} differ; worst at {i}: "
            f"got {got[i]!r}, want {want[i]!r}, bound {np.broadcast_to(bound, err.shape)[i]!r}"
        )


def cpu_slack(case: Case, want, tol):
    """close()'s scale against the CPU primitive, which computes z as
    fma(x, scale, b - mean * scale) (the kernels: (x - mean) * scale + b):
    its rounding of mean * scale adds a few ulps of |x * scale|."""
    _, mean, var, _ = oracle_forward(case)
    g = groups(case)
    cancel = np.abs(f64(case.x) * f64(case.w) / np.sqrt(var[g] + EPS))
    return max(1.0, float(np.abs(want).max()) if want.size else 1.0) + 2.0**-21 * cancel / tol


def check_forward(case: Case, got: list, tol=None):
    tol = tol or TOL[case.dtype]
    y, mean, var, _ = oracle_forward(case)
    cpu = primitive(case, mx.default_stream(mx.cpu))
    close(got[0], y, tol, what="y vs oracle")
    close(got[0], f64(cpu[0]), tol, scale=cpu_slack(case, y, tol), what="y vs CPU")
    assert got[0].dtype == case.dtype and tuple(got[0].shape) == case.shape
    if case.training:
        spread = np.sqrt(var) + 1e-3
        close(got[1], mean, 2e-6, scale=np.abs(mean) + spread, what="mean vs oracle")
        close(got[2], var, 2e-5, scale=var + 1e-6, what="var vs oracle")
        close(got[1], f64(cpu[1]), 2e-6, scale=np.abs(mean) + spread, what="mean vs CPU")
        close(got[2], f64(cpu[2]), 2e-5, scale=var + 1e-6, what="var vs CPU")
    else:
        assert len(got) == 1


def check_backward(case: Case, got: list, ct, ct_mean, ct_var, tol=None):
    tol = tol or TOL[case.dtype]
    dx, dw, db, g = oracle_backward(case, ct, ct_mean, ct_var)
    cpu = primitive_grads(case, ct, ct_mean, ct_var, mx.default_stream(mx.cpu))
    n = max(case.shape[0], 1)
    # sums of n terms: bounded by the sum of their magnitudes
    _, _, _, z = oracle_forward(case)
    close(got[0], dx, tol, what="dx vs oracle")
    close(got[0], f64(cpu[0]), tol, what="dx vs CPU")
    for i, (want, what) in enumerate(((dw, "dweight"), (db, "dbias")), start=1):
        scale = np.maximum(np.abs(want), np.sqrt(n))
        close(got[i], want, tol, scale=scale, what=f"{what} vs oracle")
        close(got[i], f64(cpu[i]), tol, scale=scale, what=f"{what} vs CPU")
        assert got[i].dtype == mx.float32
    if case.r is not None:
        assert len(got) == 4
        close(got[3], g, tol, what="dresidual vs oracle")
        close(got[3], f64(cpu[3]), tol, what="dresidual vs CPU")
    else:
        assert len(got) == 3


def run_both(rng, case: Case, schedule="random", seed=0):
    check_forward(case, metal_forward(case, schedule, seed))
    ct, ct_mean, ct_var = cotangents(rng, case)
    check_backward(case, metal_backward(case, ct, ct_mean, ct_var, schedule, seed + 1), ct, ct_mean, ct_var)


# ------------------------------------------------------------------ tests

@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("kind", ["batch", "instance", "eval"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_every_mode(rng, dtype, kind, act, residual):
    run_both(rng, make_case(rng, 300, 5, DTYPES[dtype], kind, act, residual))


@pytest.mark.parametrize("c", [3, 33, 65])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_awkward_channels_over_several_blocks(rng, c, dtype):
    # 700 rows: three row blocks; 33 and 65 channels: two and three tiles.
    run_both(rng, make_case(rng, 700, c, DTYPES[dtype], "instance", "leaky", residual=True))


@pytest.mark.parametrize("kind", ["batch", "instance", "eval"])
def test_single_row(rng, kind):
    # batch statistics of one row: var 0, y = act(bias [+ r])
    case = make_case(rng, 1, 3, mx.float32, kind, "relu", residual=True, items=2)
    run_both(rng, case)


def test_no_rows(rng):
    for kind in ("batch", "instance"):
        case = make_case(rng, 0, 4, mx.float32, kind, "relu", items=2)
        y, mean, var = metal_forward(case)
        assert tuple(y.shape) == (0, 4)
        np.testing.assert_array_equal(np.array(mean), 0.0)
        np.testing.assert_array_equal(np.array(var), 0.0)
        ct, ct_mean, ct_var = cotangents(rng, case)
        dx, dw, db = metal_backward(case, ct, ct_mean, ct_var)
        assert tuple(dx.shape) == (0, 4)
        np.testing.assert_array_equal(np.array(dw), 0.0)
        np.testing.assert_array_equal(np.array(db), 0.0)


def test_empty_segment_and_more_segments_than_a_block_holds(rng):
    # 9 segments: blocks of 512 rows; segment 4 has no rows (mean, var 0).
    ids = rng.choice([s for s in range(9) if s != 4], 1500)
    run_both(rng, make_case(rng, 1500, 6, mx.float32, "instance", "relu", residual=True, items=9, ids=ids))
    case = make_case(rng, 300, 3, mx.float32, "instance", "none", items=9, ids=rng.choice([0, 1, 2, 5], 300))
    y, mean, var = metal_forward(case)
    np.testing.assert_array_equal(np.array(mean)[[3, 4, 6, 7, 8]], 0.0)
    np.testing.assert_array_equal(np.array(var)[[3, 4, 6, 7, 8]], 0.0)


def test_more_blocks_than_merge_threads(rng):
    # 64 * 256 + 100 rows: 65 blocks, so merge threads take two blocks.
    case = make_case(rng, 64 * 256 + 100, 1, mx.float32, "batch", "leaky", residual=False)
    run_both(rng, case, schedule="forward")


@pytest.mark.parametrize("segmented", [False, True])
def test_statistics_with_large_offset_over_many_blocks(rng, segmented):
    # mean^2 >> var over 12 blocks; segment ids unsorted (runs of about one
    # row): float32 partials about shifts keep the variance (the CPU
    # primitive's bounds, tests/test_norm_act.py).
    n, c = 3000, 3
    kind = "instance" if segmented else "batch"
    case = make_case(rng, n, c, mx.float32, kind, "none", items=3, offset=1000.0, centres=50.0, spread=0.01)
    y, mean, var = metal_forward(case, "random", 3)
    want_mean, want_var = oracle_stats(case)
    np.testing.assert_allclose(f64(mean), want_mean, rtol=1e-7)
    np.testing.assert_allclose(f64(var), want_var, rtol=1e-5)
    # y from x - mean, mean rounded to float32: off by up to an ulp of the
    # mean times w / sqrt(var + eps) (about 0.006 here), no more (the
    # x * scale + shift form would also round mean * scale, about 1e5)
    g = groups(case)
    ulp = np.spacing(np.float32(np.abs(want_mean))).astype(np.float64)
    slack = (ulp * f64(case.w) / np.sqrt(want_var + EPS))[g]
    close(y, oracle_forward(case)[0], 2e-5, scale=1.0 + slack / 2e-5, what="y vs oracle")
    ct, ct_mean, ct_var = cotangents(rng, case)
    dx, dw, db = metal_backward(case, ct, ct_mean, ct_var, "random", 4)
    # at the float32 statistics the backward pass is given (the batch mean's
    # rounding, times sum g, would dominate dweight)
    want = oracle_backward(case, ct, ct_mean, ct_var, stats=(mean, var))
    close(dx, want[0], 2e-4, what="dx vs oracle")
    close(dw, want[1], 2e-4, scale=np.sqrt(n), what="dweight vs oracle")
    close(db, want[2], 2e-5, scale=np.sqrt(n), what="dbias vs oracle")


def test_every_schedule_gives_the_same_bits(rng):
    # Fixed summation orders: thread order between barriers changes nothing.
    case = make_case(rng, 900, 7, mx.float32, "instance", "relu", residual=True)
    ct, ct_mean, ct_var = cotangents(rng, case)
    runs = []
    for seed, schedule in enumerate(("forward", "reverse", "random")):
        runs.append([np.array(a) for a in metal_forward(case, schedule, seed)]
                    + [np.array(a) for a in metal_backward(case, ct, ct_mean, ct_var, schedule, seed)])
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert a.tobytes() == b.tobytes()


@pytest.mark.skipif(BACKEND == "metal", reason="edits the program's grid: harness only")
def test_elementwise_passes_stride_past_their_grid(rng, monkeypatch):
    # Past NORM_MAX_ROW_GROUPS row threadgroups the apply passes walk the
    # rows in grid strides: the same results from a grid of 3 row groups.
    case = make_case(rng, 500, 6, mx.float16, "instance", "leaky", residual=True)
    ct, ct_mean, ct_var = cotangents(rng, case)
    want = metal_forward(case) + metal_backward(case, ct, ct_mean, ct_var)

    full_grid = _ext.metal_norm_program

    def small_grid(*args):
        prog = full_grid(*args)
        for step in prog["steps"]:
            if "apply" in step["kernel"]:
                assert step["groups"][1] > 3
                step["groups"] = (step["groups"][0], 3, 1)
        return prog

    monkeypatch.setattr(_ext, "metal_norm_program", small_grid)
    got = metal_forward(case) + metal_backward(case, ct, ct_mean, ct_var)
    for a, b in zip(want, got):
        assert np.array(a).tobytes() == np.array(b).tobytes()


def test_every_kernel_of_the_family_is_tested_here():
    defined = {k for k, path in metal_harness.defined_kernels().items() if path.name == "norm_act.metal"}
    assert defined == set(KERNELS), f"kernels without a test here: {sorted(defined - set(KERNELS))}"


def test_programs_name_the_kernels_for_each_dtype(rng):
    for dtype in DTYPES:
        case = make_case(rng, 10, 2, DTYPES[dtype], "instance", "relu", residual=True)
        fwd = [s["kernel"] for s in program(case, "forward")["steps"]]
        bwd = [s["kernel"] for s in program(case, "backward")["steps"]]
        assert fwd == [f"norm_act_stats_{dtype}", "norm_act_merge", f"norm_act_apply_{dtype}"]
        assert bwd == [f"norm_act_grad_sums_{dtype}", "norm_act_grad_merge", f"norm_act_grad_apply_{dtype}"]
        eval_case = make_case(rng, 10, 2, DTYPES[dtype], "eval")
        assert [s["kernel"] for s in program(eval_case, "forward")["steps"]] == [f"norm_act_apply_{dtype}"]
    with pytest.raises(ValueError, match="direction must be 'forward' or 'backward'"):
        _ext.metal_norm_program("sideways", 4, 2, mx.float32, 1, False, True, False, 0, 0.0, EPS)
    with pytest.raises(ValueError, match="unsupported dtype for Metal kernels"):
        _ext.metal_norm_program("forward", 4, 2, mx.int32, 1, False, True, False, 0, 0.0, EPS)


def test_layers_choose_the_fused_path_per_backend(monkeypatch):
    f = mx.zeros((4, 3))
    monkeypatch.setattr(_ext, "metal_available", lambda: True)
    for backend in ("cpu", "metal", "cuda"):
        monkeypatch.setattr(backends, "current", lambda stream=None, b=backend: backends.get(b))
        assert normalization._fusable(f, None), backend
        # CUDA runs its own kernels (mlx_lattice/backends/cuda/norm.py), not the primitive
        assert (normalization._fused_op() is backends.native._layer_norm_act) == (backend != "cuda"), backend
    monkeypatch.setattr(backends, "current", lambda stream=None: backends.get("metal"))
    with fused_norms(False):  # the MLX-op path, for comparisons
        assert not normalization._fusable(f, None)
    monkeypatch.setattr(_ext, "metal_available", lambda: False)  # a build without Metal kernels
    assert not normalization._fusable(f, None)


@pytest.mark.skipif(BACKEND != "metal", reason="the layers run on a Mac's GPU")
@pytest.mark.parametrize("kind", ["batch", "instance"])
def test_layers_on_the_gpu(rng, kind, monkeypatch):
    from mlx_lattice import SparseTensor, nn

    n, c = 500, 6
    coords = np.zeros((n, 4), np.int32)
    coords[:, 0] = rng.integers(0, 2, n)
    coords[:, 1:] = rng.permutation(40**3)[:n, None] // np.array([1600, 40, 1]) % 40
    x = SparseTensor(coords, mx.array(rng.standard_normal((n, c)).astype(np.float32)))
    norm = nn.BatchNorm(c) if kind == "batch" else nn.InstanceNorm(c)
    calls = []
    # a batch norm's training call takes norm_act_running (its running statistics folded in)
    for name in ("norm_act", "norm_act_running"):
        monkeypatch.setattr(_ext, name, lambda *a, f=getattr(_ext, name), **k: calls.append(1) or f(*a, **k))
    y = nn.norm_act(norm, x, nn.ReLU())
    assert calls, "the layer took the MLX-op path on a Metal GPU"
    case = Case(x.feats, mx.ones((c,)), mx.zeros((c,)), None,
                None if kind == "batch" else mx.array(coords[:, 0]), 1 if kind == "batch" else 2, None, "relu")
    close(y.feats, oracle_forward(case)[0], TOL[mx.float32])
