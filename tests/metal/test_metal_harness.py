"""Self-tests of the Metal CPU harness (tests/metal/metal_harness).

Correct kernels (selftest/basic.metal) must match NumPy under every
schedule; kernels with planted bugs (selftest/broken.metal) must be caught.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import metal_harness as mh

_ok, _why = mh.available()
pytestmark = [pytest.mark.metal, pytest.mark.skipif(not _ok, reason=_why)]

SELFTEST = Path(mh.__file__).parent / "selftest"
BASIC = SELFTEST / "basic.metal"
BROKEN = SELFTEST / "broken.metal"
SCHEDULES = ("forward", "reverse", "random")
f32 = np.float32


def line_of(snippet: str, path: Path = BROKEN) -> str:
    """'broken.metal:<line>' of the line containing `snippet`."""
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if snippet in line:
            return f"{path.name}:{i}"
    raise AssertionError(f"{snippet!r} not in {path}")


def scale_params(n, scale):
    return np.array([(n, scale)], dtype=[("n", "<u4"), ("scale", "<f4")])[0]


def run(kernel, *args, source=BASIC, **kwargs):
    return mh.run_kernel(source, kernel, *args, **kwargs)


# ---------------------------------------------------------------- correct kernels


def test_buffers_params_and_guard():
    x = np.arange(40, dtype=f32)
    _, y = run("scale", [x, np.full(40, -1, f32)], scale_params(37, 2.5), groups=2, threads=32)
    np.testing.assert_array_equal(y[:37], x[:37] * 2.5)
    np.testing.assert_array_equal(y[37:], -1)
    # Inputs are copied, never modified.
    np.testing.assert_array_equal(x, np.arange(40, dtype=f32))


def test_dispatch_threads_has_partial_groups():
    x = np.arange(50, dtype=f32)
    _, y = run("copy_unguarded", [x, np.zeros(50, f32)], grid=50, threads=32)
    np.testing.assert_array_equal(y, x)
    # The same kernel on whole threadgroups touches elements 50..63.
    with pytest.raises(mh.KernelError, match=r"out-of-bounds read of buffer\(0\) at byte offset 200"):
        run("copy_unguarded", [x, np.zeros(50, f32)], groups=2, threads=32)


def test_vector_types_swizzles_and_half_literals():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((9, 4)) * 3).astype(f32)
    _, y, z = run("vector_ops", [x, np.zeros((9, 4), f32), np.zeros(9, np.uint32)], groups=1, threads=9)
    r = np.stack([x[:, 0], x[:, 1], x[:, 3] * 2 + 0.5, np.full(9, 1.5, f32)], 1)
    np.testing.assert_allclose(y, np.where(r > 2, np.clip(r, -1, 1), r), rtol=1e-6)
    popcount = np.array([bin(i).count("1") for i in range(9)], np.uint32)
    np.testing.assert_array_equal(z, x[:, 0].view(np.uint32) ^ popcount)


def test_matrices():
    rng = np.random.default_rng(1)
    m = rng.standard_normal((5, 4, 4)).astype(f32)  # 5 float4x4, each 4 columns of float4
    v = rng.standard_normal((5, 4)).astype(f32)
    *_, out = run("matrix_ops", [m, v, np.zeros((20, 4), f32)], groups=1, threads=5)
    out = out.reshape(5, 4, 4)
    for i in range(5):
        a = m[i].T.astype(np.float64)  # a[row, column]
        np.testing.assert_allclose(out[i, 0], a @ v[i], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out[i, 1], v[i] @ a, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out[i, 2], (a.T @ a)[:, 1], rtol=1e-5, atol=1e-5)
        dets = [np.linalg.det(a), np.linalg.det(a[:3, :3]), np.linalg.det(a[:2, :2]), a[2, 3]]
        np.testing.assert_allclose(out[i, 3], dets, rtol=1e-4, atol=1e-5)


def test_vector_comparisons_select_and_swizzles():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((16, 4)).astype(f32)
    b = rng.standard_normal((16, 4)).astype(f32)
    b[3] = a[3] + 1  # every component less
    *_, out, flags = run("compare_select", [a, b, np.zeros((16, 4), f32), np.zeros(16, np.uint32)],
                          groups=1, threads=16)
    lt = a < b
    r = np.where(lt, b, a)[:, ::-1].copy()
    r[:, [0, 1]] = r[:, [1, 0]]
    np.testing.assert_array_equal(out, r)
    want = lt.any(1) * 1 + lt.all(1) * 2 + (~lt[:, :2]).all(1) * 4
    np.testing.assert_array_equal(flags, want.astype(np.uint32))


def test_dispatch_builtins_on_a_partial_threadgroup():
    (out,) = run("dispatch_inputs", [np.zeros(50 * 4, np.uint32)], grid=50, threads=32)
    out = out.reshape(50, 4)
    np.testing.assert_array_equal(out[:, 0], 32)
    np.testing.assert_array_equal(out[:, 1], [32] * 32 + [18] * 18)
    np.testing.assert_array_equal(out[:, 2], 1)
    np.testing.assert_array_equal(out[:, 3], 8)


def test_threadgroup_buffer_argument():
    x = np.arange(64, dtype=f32)
    _, y = run("reverse_groups", [x, np.zeros(64, f32)], groups=2, threads=32, threadgroup_buffers=[128])
    np.testing.assert_array_equal(y, np.concatenate([x[31::-1], x[:31:-1]]))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_simd_functions(schedule):
    rng = np.random.default_rng(1)
    v = rng.standard_normal(128).astype(f32)
    _, out, bits = run(
        "simd_ops", [v, np.zeros(128 * 12, f32), np.zeros(256, np.uint32)],
        groups=2, threads=64, schedule=schedule, seed=3,
    )
    o = out.reshape(128, 12)
    vv = v.reshape(4, 32)
    lane = np.arange(128) % 32
    base = np.arange(128) - lane
    np.testing.assert_allclose(o[:, 0], np.repeat(vv.sum(1), 32), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(o[:, 1], np.repeat(vv.max(1), 32))
    np.testing.assert_array_equal(o[:, 2], np.repeat(vv.min(1), 32))
    np.testing.assert_allclose(o[:, 3], (np.cumsum(vv, 1) - vv).ravel(), atol=1e-5)
    np.testing.assert_allclose(o[:, 4], np.cumsum(vv, 1).ravel(), atol=1e-5)
    np.testing.assert_array_equal(o[:, 5], v[base + (lane * 7) % 32])
    np.testing.assert_array_equal(o[:, 6], np.where(lane + 3 < 32, v[np.minimum(base + lane + 3, 127)], v))
    np.testing.assert_array_equal(o[:, 7], np.where(lane >= 5, v[np.maximum(base + lane - 5, 0)], v))
    np.testing.assert_array_equal(o[:, 8], v[base + (lane ^ 6)])
    np.testing.assert_array_equal(o[:, 9], v[base + 17])
    np.testing.assert_array_equal(o[:, 10], 32)
    np.testing.assert_allclose(o[:, 11], np.repeat(v.reshape(32, 4).sum(1), 4), atol=1e-5)
    b = bits.reshape(128, 2)
    weights = np.uint64(1) << np.arange(32, dtype=np.uint64)
    ballots = [int((weights * (vv[g] > 0)).sum()) for g in range(4)]
    np.testing.assert_array_equal(b[:, 0], np.repeat(ballots, 32).astype(np.uint32))
    np.testing.assert_array_equal(b[:, 1], (np.cumsum(vv > 0, 1) - (vv > 0)).ravel())


def test_simd_functions_on_a_partial_simdgroup():
    # 48 threads: simdgroup 1 has 16 lanes; collectives see only those.
    v = np.arange(1, 49, dtype=f32)
    _, out, _ = run("simd_ops", [v, np.zeros(48 * 12, f32), np.zeros(96, np.uint32)], grid=48, threads=64)
    o = out.reshape(48, 12)
    np.testing.assert_array_equal(o[32:, 0], v[32:].sum())
    np.testing.assert_array_equal(o[32:, 4], np.cumsum(v[32:]))
    assert np.isnan(o[32, 9]), "reading a lane that does not exist gives NaN"


@pytest.mark.parametrize(
    "dispatch",
    [dict(grid=100, threads=64), dict(groups=2, threads=64, schedule="reverse"),
     dict(grid=100, threads=40, schedule="random")],
)
def test_prefix_scan(dispatch):
    rng = np.random.default_rng(2)
    x = rng.integers(0, 10, 100).astype(np.uint32)
    _, y = run("block_scan", [x, np.zeros(100, np.uint32)], [100], **dispatch)
    t = dispatch["threads"]
    np.testing.assert_array_equal(y, np.concatenate([np.cumsum(x[i : i + t]) for i in range(0, 100, t)]))


def test_atomic_histogram():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 1000, 300).astype(np.uint32)
    _, hist, total = run(
        "histogram", [x, np.zeros(64, np.uint32), np.zeros(1, f32)], [300],
        groups=10, threads=32, schedule="random", seed=7,
    )
    np.testing.assert_array_equal(hist, np.bincount(x % 64, minlength=64))
    assert total[0] == pytest.approx(float(x.sum()), rel=1e-6)


@pytest.mark.parametrize("dtype,kernel,tol", [(np.float32, "gemm_tiled_float", 1e-5), (np.float16, "gemm_tiled_half", 1e-2)])
def test_tiled_gemm_with_simdgroup_matrix(dtype, kernel, tol):
    rng = np.random.default_rng(4)
    m, n, k = 37, 29, 21
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    _, _, c = run(kernel, [a, b, np.zeros((m, n), dtype)], [m, n, k], groups=(2, 3), threads=128, schedule="random")
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c.astype(np.float64), ref, rtol=tol, atol=tol * 10)


def test_simdgroup_matrix_origin_transpose_and_diagonal():
    src = np.arange(256, dtype=f32).reshape(16, 16)
    _, d, dg = run("matrix_roundtrip", [src, np.zeros((8, 8), f32), np.zeros((8, 8), f32)], groups=1, threads=32)
    # matrix_origin is (column, row) in the source; transpose flips the block.
    np.testing.assert_array_equal(d, src[0:8, 8:16].T)
    np.testing.assert_array_equal(dg, 2 * d)


def test_shim_breadth():
    out, counter = run("features", [np.zeros(32 * 18, f32), np.zeros(1, np.int32)], threads=32,
                       source=SELFTEST / "features.metal")
    o = out.reshape(32, 18)
    lane = np.arange(32)
    fixed = [32, 5, 2, 3, 2.5, 0x3C00, 6, None, 38, 32, 3, 6, 3, 2, 255, 3, 1, 2]
    for j, want in enumerate(fixed):
        if want is not None:
            np.testing.assert_array_equal(o[:, j], want, err_msg=f"slot {j}")
    np.testing.assert_array_equal(o[:, 7], np.where(lane < 28, lane + 4, -1))
    assert counter[0] == 31


# ---------------------------------------------------------------- planted bugs


def test_out_of_bounds_write_names_kernel_buffer_and_line():
    x = np.arange(16, dtype=f32)
    with pytest.raises(mh.KernelError) as e:
        run("oob_write", [x, np.zeros(20, f32)], groups=1, threads=32, source=BROKEN)
    msg = str(e.value)
    assert "kernel oob_write" in msg and "out-of-bounds write of buffer(1)" in msg
    assert "thread (20,0,0)" in msg
    assert line_of("y[gid] = v;  // PLANTED") in msg


def test_out_of_bounds_read():
    with pytest.raises(mh.KernelError, match=r"out-of-bounds read of buffer\(0\)") as e:
        run("oob_read", [np.zeros(16, f32), np.zeros(16, f32)], groups=1, threads=16, source=BROKEN)
    assert line_of("x[gid + 1];  // PLANTED") in str(e.value)


def test_write_before_buffer_start():
    with pytest.raises(mh.KernelError, match=r"before the start of buffer\(0\)"):
        run("negative_write", [np.zeros(16, f32)], groups=1, threads=16, source=BROKEN)


def test_threadgroup_array_overflow():
    with pytest.raises(mh.KernelError, match="out-of-bounds write of threadgroup array 'tile'") as e:
        run("tg_array_overflow", [np.zeros(64, f32)], groups=1, threads=64, source=BROKEN)
    assert line_of("tile[tid] = 1.0f;  // PLANTED") in str(e.value)


def test_missing_barrier_is_exposed_by_the_schedules():
    x = np.arange(512, dtype=f32)
    ref = x + np.concatenate([np.roll(x[:256], -1), np.roll(x[256:], -1)])
    results = {}
    for s in SCHEDULES:
        (_, y) = run("neighbour_sum", [x, np.zeros(512, f32)], [0], groups=2, threads=256, schedule=s, source=BROKEN)
        results[s] = y
        # Reads of slots not yet written see the NaN poison.
        assert np.isnan(y).any()
        (_, good) = run("neighbour_sum", [x, np.zeros(512, f32)], [1], groups=2, threads=256, schedule=s, source=BROKEN)
        np.testing.assert_array_equal(good, ref)
    assert not np.array_equal(results["forward"], results["reverse"], equal_nan=True)


def test_reading_unwritten_threadgroup_memory_gives_nan():
    _, y = run("unwritten_tg_read", [np.arange(64, dtype=f32), np.zeros(64, f32)], groups=1, threads=64, source=BROKEN)
    assert np.isnan(y[:32]).all() and not np.isnan(y[32:]).any()


def test_divergent_simd_sum_is_an_error():
    with pytest.raises(mh.KernelError, match="divergent simd-group operation") as e:
        run("divergent_simd_sum", [np.zeros(64, f32), np.zeros(64, f32)], groups=1, threads=64, source=BROKEN)
    assert "lanes 0-15 wait at simd_sum" in str(e.value)
    assert line_of("v = simd_sum(v);  // PLANTED") in str(e.value)


def test_divergent_barrier_is_an_error():
    with pytest.raises(mh.KernelError, match="divergent threadgroup_barrier") as e:
        run("divergent_barrier", [np.zeros(64, f32)], groups=1, threads=64, source=BROKEN)
    assert "threads 0-31 wait" in str(e.value) and "threads 32-63 wait" in str(e.value)


@pytest.mark.parametrize("schedule", ["forward", "reverse", "random"])
def test_returning_before_a_barrier(schedule):
    # Threads that returned from the kernel have finished: Apple GPUs release
    # them from threadgroup barriers (MLX's column reductions rely on it), so
    # the rest of the group synchronises and finishes.
    (y,) = run("early_return_barrier", [np.zeros(100, f32)], [100], groups=2, threads=64, source=BROKEN,
               schedule=schedule)
    np.testing.assert_array_equal(y, np.arange(100, dtype=f32))


def test_returning_before_a_simd_collective():
    # Lanes that returned skip a simd_sum the rest of their simdgroup reaches:
    # an error (the harness wants every lane), tolerated when not strict.
    with pytest.raises(mh.KernelError, match="divergent simd-group operation") as e:
        run("early_return_simd", [np.zeros(100, f32)], [100], groups=2, threads=64, source=BROKEN)
    assert "returned" in str(e.value)
    (y,) = run("early_return_simd", [np.zeros(100, f32)], [100], groups=2, threads=64, source=BROKEN, strict=False)
    np.testing.assert_array_equal(y[:96], np.full(96, 32, f32))
    np.testing.assert_array_equal(y[96:], np.full(4, 4, f32))


def test_threadgroup_memory_limit():
    with pytest.raises(mh.KernelError, match="36000 bytes.*exceeds the 32768-byte limit"):
        run("tg_memory_too_big", [np.zeros(64, f32)], groups=1, threads=64, source=BROKEN)
    x = np.zeros(64, f32)
    with pytest.raises(mh.KernelError, match="over the 32768-byte limit"):
        run("reverse_groups", [x, x.copy()], groups=2, threads=32, threadgroup_buffers=[40000])
    with pytest.raises(mh.KernelError, match="not a multiple of 16"):
        run("reverse_groups", [x, x.copy()], groups=2, threads=32, threadgroup_buffers=[120])


def test_threads_per_threadgroup_limit():
    with pytest.raises(mh.KernelError, match="1025 threads per threadgroup exceed the limit of 1024"):
        run("scale", [np.zeros(4, f32), np.zeros(4, f32)], scale_params(4, 1.0), threads=(1025, 1, 1))


def test_a_kernel_that_never_yields_times_out():
    with pytest.raises(mh.KernelError, match="time limit exceeded"):
        run("spin_forever", [np.zeros(1, np.uint32)], groups=2, threads=1, timeout=0.3, source=BROKEN)


def test_binding_errors():
    x = np.zeros(8, f32)
    with pytest.raises(mh.KernelError, match=r"'y' reads buffer\(1\), which is not bound"):
        run("copy_unguarded", [x], groups=1, threads=8)
    with pytest.raises(mh.KernelError, match=r"needs 8 bytes but buffer\(2\) has 4"):
        run("scale", [x, x.copy()], np.zeros(1, np.uint32), groups=1, threads=8)
    with pytest.raises(TypeError, match="int32 fields only"):
        run("scale", [x, x.copy()], [8, 1.5], groups=1, threads=8)
    with pytest.raises(mh.HarnessError, match="defines no kernel"):
        run("no_such_kernel", [x], groups=1, threads=8)


def test_runs_are_recorded_for_coverage():
    run("scale", [np.zeros(4, f32), np.zeros(4, f32)], scale_params(4, 1.0), threads=4)
    assert "harness" in mh.kernels_ran()["scale"]


# ---------------------------------------------------------------- tensor ops (MSL 4.0 subset)

TENSOR_OPS = SELFTEST / "tensorops_matmul.metal"


def mm_params(rows, k, zero=1):
    return np.array([(rows, k, zero)], dtype=[("rows", "<i4"), ("k", "<i4"), ("zero", "<i4")])[0]


def f64(a):
    return a.astype(np.float64)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_matmul2d_cooperative_destination_and_partial_tile(schedule):
    rng = np.random.default_rng(20)
    rows, k = 100, 40  # the second 64-row tile is partial
    a = rng.standard_normal((rows, k)).astype(np.float16)
    b = rng.standard_normal((k, 32)).astype(np.float16)
    c = np.full((rows, 32), np.nan, f32)
    _, _, out = run("mm_coop", [a, b, c], mm_params(rows, k), groups=2, threads=128,
                    schedule=schedule, seed=3, source=TENSOR_OPS)
    np.testing.assert_allclose(out, f64(a) @ f64(b), rtol=1e-5, atol=1e-5)


def test_matmul2d_k_loop_accumulates_in_float_and_reads_zeros_past_extents():
    rng = np.random.default_rng(21)
    k = 40  # chunks of 16: the last one is partial
    a = rng.standard_normal((32, k)).astype(f32)
    b = rng.standard_normal((k, 16)).astype(np.float16)
    c = np.full((32, 16), np.nan, f32)
    _, _, out = run("mm_kloop", [a, b, c], mm_params(32, k), threads=32, schedule="reverse", source=TENSOR_OPS)
    np.testing.assert_allclose(f64(out), f64(a) @ f64(b), rtol=1e-5, atol=1e-5)
    # The accumulator's elements are undefined until written: NaN here.
    _, _, out = run("mm_kloop", [a, b, c], mm_params(32, k, zero=0), threads=32, source=TENSOR_OPS)
    assert np.isnan(f64(out)).all()


def test_matmul2d_transposes_and_multiply_accumulate_into_a_tensor():
    rng = np.random.default_rng(22)
    k = 13
    at = rng.standard_normal((k, 16)).astype(f32)  # A^T
    bt = rng.standard_normal((24, k)).astype(f32)  # B^T
    c0 = rng.standard_normal((16, 24)).astype(f32)
    _, _, out = run("mm_transposed", [at, bt, c0], mm_params(16, k), threads=64, schedule="random",
                    source=TENSOR_OPS)
    np.testing.assert_allclose(out, c0 + f64(at).T @ f64(bt).T, rtol=1e-5, atol=1e-5)


def test_matmul2d_strided_views_and_edges():
    rng = np.random.default_rng(23)
    lda, ldb, ldc, am, k, cm, cn = 11, 19, 20, 12, 8, 14, 9
    a = rng.standard_normal((am, lda)).astype(np.float16)
    b = rng.standard_normal((k, ldb)).astype(np.float16)
    c = np.full((16, ldc), -7.0, f32)
    params = np.array([(lda, ldb, ldc, am, k, cm, cn)], dtype=[(n, "<i4") for n in "abcdefg"])[0]
    _, _, out = run("mm_strided", [a, b, c], params, threads=32, source=TENSOR_OPS)
    A = np.zeros((16, k))
    A[:am] = f64(a)[:, 1 : 1 + k]  # rows past the view read as zero
    full = A @ f64(b)[:, 2:18]
    expected = np.full((16, ldc), -7.0)
    expected[:cm, :cn] = full[:cm, :cn]  # nothing written past the view
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_matmul2d_without_barrier_after_staging_reads_nan():
    rng = np.random.default_rng(24)
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 16)).astype(np.float16)
    _, _, out = run("mm_unsynchronised", [a, b, np.zeros((16, 16), f32)], threads=32, source=TENSOR_OPS)
    assert np.isnan(out).any()


def test_matmul2d_scope_must_match_the_threadgroup():
    a, b = np.zeros((64, 8), np.float16), np.zeros((8, 32), np.float16)
    with pytest.raises(mh.KernelError, match=r"execution_simdgroups<4> \(128 threads\) but the threadgroup has 64"):
        run("mm_coop", [a, b, np.zeros((64, 32), f32)], mm_params(64, 8), threads=64, source=TENSOR_OPS)
