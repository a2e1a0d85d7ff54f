"""The CPU kernels on every instruction-set path this machine supports.

Each path (baseline, avx2, avx512 on x86-64; neon on arm64) is checked
against the oracle for forward, input and weight gradients, quantized
weights, grouped and depthwise convolution, patch attention and the fused
norms, across dtypes, awkward channel counts, batches
and empty inputs;
results must be bitwise identical across thread counts on each path, and
across the paths that share fused multiply-adds (avx2, avx512).
"""

import functools
import os
from pathlib import Path
import platform
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import QuantizedWeight, _ext, nn, ops

import oracle
from conftest import TOLERANCES, to_np
from test_attention_cpu import dense_attention
from test_attention_cpu import grads as attention_grads
from test_attention_cpu import inputs as attention_inputs
from test_attention_cpu import lengths_for as attention_lengths
from test_grouped import grad_case as grouped_case
from test_grouped import grouped_weight
from test_norm_act import test_batch_norm_act_values as norm_values
from test_norm_act import test_bitwise_identical_across_thread_counts as norm_bitwise_across_threads
from test_norm_act import test_fused_matches_op_path_with_gradients as norm_matches_op_path
from test_norm_act import tensor as norm_tensor

PATHS = _ext.supported_cpu_isas()
# Paths with fused multiply-adds sum identically; the x86-64 baseline (SSE2)
# rounds each product and sum apart, so it matches them only to rounding.
FMA_PATHS = [p for p in PATHS if p in ("avx2", "avx512")]


@pytest.fixture(autouse=True)
def cpu_device(on_cpu):
    yield


def test_paths_reported():
    built = _ext.built_cpu_isas()
    assert PATHS and set(PATHS) <= set(built)
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64") and _ext.CPU_PATHS_BUILT == "all":
        assert built == ["baseline", "avx2", "avx512"]
    elif machine in ("x86_64", "amd64"):
        # built for this machine: the paths its CPU runs, asked of the OS
        # here (the build asked the CPU itself, cmake/cpu_paths_probe.cpp)
        assert _ext.CPU_PATHS_BUILT == "native"
        assert built == ["baseline", *_cpu_flag_paths()]
    elif machine in ("aarch64", "arm64"):
        assert built == ["neon"]
    # without MLX_LATTICE_CPU_ISA, the best supported path is chosen
    if not os.environ.get("MLX_LATTICE_CPU_ISA"):
        code = "from mlx_lattice import _ext; print(_ext.cpu_isa())"
        env = {k: v for k, v in os.environ.items() if k != "MLX_LATTICE_CPU_ISA"}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == PATHS[-1]


def _cpu_flag_paths() -> list[str]:
    """The wide x86-64 paths this CPU runs, from the kernel's CPU flags."""
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("needs /proc/cpuinfo to tell which instruction sets the CPU has")
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    avx2 = {"avx2", "fma", "f16c"} <= flags
    return [p for p, ok in (("avx2", avx2), ("avx512", avx2 and "avx512f" in flags)) if ok]


def test_set_path_and_route_log(isa):
    assert _ext.cpu_isa() == isa
    assert ml.diagnostics.capability_tier("cpu") == f"cpu:{isa}"
    coords = oracle.random_coords(np.random.default_rng(0), 20, 4)
    x = ml.SparseTensor(coords, mx.ones((len(coords), 4)))
    with ml.diagnostics.record() as log:
        mx.eval(ops.subm_conv3d(x, mx.ones((4, 3, 3, 3, 4))).feats)
    assert log[0]["tier"] == f"cpu:{isa}"


def test_set_path_validation(restore_isa):
    with pytest.raises(ValueError, match=r"unknown instruction-set path 'sse9'.*carries: "):
        _ext.set_cpu_isa("sse9")
    for name in set(_ext.built_cpu_isas()) - set(PATHS):
        with pytest.raises(ValueError, match=f"does not support '{name}'"):
            _ext.set_cpu_isa(name)


@pytest.mark.parametrize("name", sorted(set(_ext.built_cpu_isas()) | {"sse9"}))
def test_environment_forces_path(name):
    env = dict(os.environ, MLX_LATTICE_CPU_ISA=name)
    code = "import mlx_lattice as ml; print(ml._ext.cpu_isa(), ml.diagnostics.capability_tier('cpu'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if name in PATHS:
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [name, f"cpu:{name}"]
    else:
        assert out.returncode != 0
        assert f"MLX_LATTICE_CPU_ISA={name}: cpu_isa:" in out.stderr


def _conv_case(rng, op, c_in, c_out, dtype, n=70, extent=6, batches=2):
    coords = oracle.random_coords(rng, n, extent, batches)
    feats = mx.array(rng.standard_normal((len(coords), c_in)).astype(np.float32)).astype(dtype)
    ks = 2 if op == "down" else (1 if op == "pointwise" else 3)
    w = mx.array((rng.standard_normal((c_out, ks, ks, ks, c_in)) / np.sqrt(c_in * ks**3)).astype(np.float32))
    w = w.astype(dtype)
    x = ml.SparseTensor(coords, feats)
    if op == "subm":
        fn = lambda f, w: ops.subm_conv3d(x.replace(f), w).feats  # noqa: E731
        sup, edges = coords, oracle.conv_edges(coords, coords, 3, 1, 1)
    elif op == "down":
        fn = lambda f, w: ops.conv3d(x.replace(f), w, stride=2).feats  # noqa: E731
        sup = oracle.forward_support(coords, 2, 2)
        edges = oracle.conv_edges(coords, sup, 2, 2)
    elif op == "up":
        fn = lambda f, w: ops.conv_transpose3d(x.replace(f), w, stride=2, padding=1).feats  # noqa: E731
        sup = coords.astype(np.int64) * np.array([1, 2, 2, 2])
        edges = oracle.transposed_edges(coords, sup, 3, 2, 1)
    else:
        fn = lambda f, w: ops.conv3d(x.replace(f), w).feats  # noqa: E731
        sup, edges = coords, oracle.conv_edges(coords, coords, 1)
    ct = mx.array(rng.standard_normal((len(sup), c_out)).astype(np.float32)).astype(dtype)
    return fn, feats, w, ct, sup, edges


def _bytes(a):
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a).tobytes()


def _run(fn, feats, w, ct):
    y, vjp = mx.vjp(fn, [feats, w], [ct])
    out = [y[0], *vjp]
    mx.eval(out)
    return out


@pytest.mark.parametrize(
    "op,c_in,c_out,dtype",
    [
        ("subm", 1, 3, mx.float32),
        ("subm", 17, 33, mx.float32),
        ("subm", 64, 64, mx.float32),  # weight gradient read in place
        ("subm", 72, 40, mx.float32),
        ("subm", 96, 64, mx.float32),  # weight gradient read in place (A + B <= 192)
        ("subm", 128, 80, mx.float32),  # in place, 32-edge sub-panels (192 < A + B <= 384)
        ("subm", 272, 128, mx.float32),  # weight gradient over packed panels (A + B > 384)
        ("down", 32, 64, mx.float32),
        ("down", 33, 13, mx.float16),
        ("up", 48, 24, mx.bfloat16),
        ("subm", 32, 32, mx.float16),
        ("pointwise", 65, 7, mx.bfloat16),
        # narrow C_out: the weight gradient's tiles hold C_in in vectors
        ("pointwise", 48, 4, mx.float32),  # read in place
        ("subm", 40, 20, mx.float32),  # packed panels
        ("subm", 160, 12, mx.float16),  # packed panels, widened
        # one-vector weight-gradient tiles on AVX-512: 16 rows, 15 + 15
        ("subm", 16, 16, mx.float32),
        ("subm", 30, 16, mx.float32),
    ],
)
def test_kernels_match_oracle(rng, isa, op, c_in, c_out, dtype):
    fn, feats, w, ct, sup, edges = _conv_case(rng, op, c_in, c_out, dtype)
    y, dx, dw = _run(fn, feats, w, ct)
    if op != "up":  # forward outputs keep oracle order; transpose checked by rows below
        assert y.shape == (len(sup), c_out)
    x_q, w_q, ct_q = to_np(feats), to_np(w), to_np(ct)
    expected = oracle.apply(edges, x_q, w_q, len(sup))
    e_dx, e_dw, _ = oracle.grads(edges, x_q, w_q, ct_q)
    tol = TOLERANCES[dtype]
    scale = 1 + np.sqrt(c_in / 16)  # longer sums round further
    tol = dict(rtol=tol["rtol"] * scale, atol=tol["atol"] * scale)
    np.testing.assert_allclose(to_np(y), expected, **tol)
    np.testing.assert_allclose(to_np(dx), e_dx, **tol)
    # weight gradients sum over every edge of an offset: compare relative to their size
    np.testing.assert_allclose(to_np(dw), e_dw, rtol=tol["rtol"], atol=tol["atol"] * max(1.0, np.abs(e_dw).max()))


@pytest.mark.parametrize("op,c_in,c_out,dtype", [
    ("subm", 32, 32, mx.float32),  # summed in place
    ("subm", 16, 16, mx.float16),  # summed in the block buffer
    ("subm", 48, 48, mx.float32),
    ("down", 64, 64, mx.float32),
    ("up", 32, 16, mx.float32),
    ("subm", 32, 128, mx.float32),  # column blocks sharing a walk
    ("subm", 48, 80, mx.float32),  # column blocks of different widths
])
def test_staged_many_tiles_match_oracle(rng, isa, op, c_in, c_out, dtype):
    # 16-64 input channels (the staged traversal where the path has it),
    # with hundreds of tiles per offset in several row blocks and
    # part-filled last tiles.
    fn, feats, w, ct, sup, edges = _conv_case(rng, op, c_in, c_out, dtype, n=6000, extent=28, batches=2)
    y, dx, _ = _run(fn, feats, w, ct)
    x_q, w_q, ct_q = to_np(feats), to_np(w), to_np(ct)
    e_dx, _, _ = oracle.grads(edges, x_q, w_q, ct_q)
    tol = {k: v * (1 + np.sqrt(c_in / 16)) for k, v in TOLERANCES[dtype].items()}
    np.testing.assert_allclose(to_np(y), oracle.apply(edges, x_q, w_q, len(sup)), **tol)
    np.testing.assert_allclose(to_np(dx), e_dx, **tol)


def test_weight_gradient_many_chunks(rng, isa):
    # > 4096 edges per offset: several partial sums reduced in chunk order
    n, c_in, c_out = 9000, 8, 16
    x = rng.standard_normal((n, c_in)).astype(np.float32)
    ct = rng.standard_normal((n, c_out)).astype(np.float32)
    coords = np.stack([np.zeros(n), np.arange(n) % 30, np.arange(n) // 30 % 30, np.arange(n) // 900], 1)
    t = ml.SparseTensor(coords.astype(np.int32), mx.array(x))
    w = mx.zeros((c_out, 1, 1, 1, c_in))
    _, (dw,) = mx.vjp(lambda w: ops.conv3d(t, w).feats, [w], [mx.array(ct)])
    expected = (ct.astype(np.float64).T @ x.astype(np.float64)).reshape(c_out, 1, 1, 1, c_in)
    np.testing.assert_allclose(np.array(dw), expected, rtol=1e-4, atol=1e-3)


def test_empty_input(isa):
    x = ml.SparseTensor(np.zeros((0, 4), np.int32), mx.zeros((0, 5)))
    fn = lambda f, w: ops.subm_conv3d(x.replace(f), w).feats  # noqa: E731
    y, dx, dw = _run(fn, x.feats, mx.ones((6, 3, 3, 3, 5)), mx.zeros((0, 6)))
    assert y.shape == (0, 6) and dx.shape == (0, 5)
    assert np.array_equal(np.array(dw), np.zeros((6, 3, 3, 3, 5), np.float32))


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 64)])
def test_quantized(rng, isa, bits, group):
    coords = oracle.random_coords(rng, 60, 6, 2)
    feats = mx.array(rng.standard_normal((len(coords), 64)).astype(np.float32))
    w = mx.array((rng.standard_normal((24, 3, 3, 3, 64)) / 40).astype(np.float32))
    q = QuantizedWeight.from_float(w, bits=bits, group_size=group)
    x = ml.SparseTensor(coords, feats)
    y = ops.subm_conv3d(x, q)
    edges = oracle.conv_edges(coords, coords, 3, 1, 1)
    expected = oracle.apply(edges, np.array(feats), to_np(q.dequantize()), len(coords))
    np.testing.assert_allclose(to_np(y.feats), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c_in,c_out", [(32, 96), (32, 24), (64, 80), (16, 200)])
def test_column_blocks_of_a_wide_output_sum_as_alone(rng, isa, c_in, c_out):
    # A wide output's column blocks (16 / 8 floats per vector: AVX-512 96 =
    # 64 + 32, AVX2 24 = 16 + 8) may take another traversal than the same
    # columns alone (the staged one for a one-block output, block_product
    # for a wider output's last, narrower block): the same sums, bit for bit.
    # Forward (C_in -> C_out) and input gradient (C_out read as C_in).
    coords = oracle.random_coords(rng, 3000, 24, 2)
    x = ml.SparseTensor(coords, mx.array(rng.standard_normal((len(coords), c_in)).astype(np.float32)))
    w = mx.array((rng.standard_normal((c_out, 3, 3, 3, c_in)) / np.sqrt(27 * c_in)).astype(np.float32))
    y = np.array(ops.subm_conv3d(x, w).feats)
    for c0 in range(0, c_out, 16):
        part = np.array(ops.subm_conv3d(x, w[c0:c0 + 16]).feats)
        assert part.tobytes() == y[:, c0:c0 + 16].tobytes(), (c0, c_out)
    wide = ml.SparseTensor(coords, mx.array(rng.standard_normal((len(coords), c_out)).astype(np.float32)))
    w2 = mx.array((rng.standard_normal((c_in, 3, 3, 3, c_out)) / np.sqrt(27 * c_in)).astype(np.float32))
    ct = mx.array(rng.standard_normal((len(coords), c_in)).astype(np.float32))

    def dx(feats, weight):
        return np.array(mx.vjp(lambda f: ops.subm_conv3d(wide.replace(f), weight).feats, [feats], [ct])[1][0])

    full = dx(wide.feats, w2)
    for c0 in range(0, c_out, 16):
        part = dx(wide.feats[:, c0:c0 + 16], w2[..., c0:c0 + 16])
        assert part.tobytes() == full[:, c0:c0 + 16].tobytes(), (c0, c_out)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("c_in,c_out", [(24, 40), (32, 32)])
def test_bitwise_across_threads(rng, isa, dtype, c_in, c_out):
    fn, feats, w, ct, _, _ = _conv_case(rng, "subm", c_in, c_out, dtype, n=3000, extent=24, batches=2)
    ml.set_num_threads(1)
    ref = [_bytes(a) for a in _run(fn, feats, w, ct)]
    for n in (2, 5):
        ml.set_num_threads(n)
        assert [_bytes(a) for a in _run(fn, feats, w, ct)] == ref


@functools.lru_cache(maxsize=1)
def _block_case():
    coords = oracle.random_coords(np.random.default_rng(7), 12000, 30, 1)
    return coords, np.asarray(oracle.conv_edges(coords, coords, 3, 1, 1)).T


def _weight_grad_across_threads(conv, x, w, ct):
    """conv's weight gradient with 1 thread, after asserting 2 and 3 threads
    give the same bytes."""
    grad = lambda: mx.vjp(lambda w: conv(x, w).feats, [w], [ct])[1][0]  # noqa: E731
    ml.set_num_threads(1)
    ref = grad()
    mx.eval(ref)
    for n in (2, 3):
        ml.set_num_threads(n)
        assert _bytes(grad()) == _bytes(ref)
    return ref


@pytest.mark.parametrize("c_in,c_out", [(8, 16), (40, 24), (48, 4)])
def test_weight_gradient_row_blocks_bitwise_across_threads(rng, isa, c_in, c_out):
    # Enough rows and edges that the weight gradient cuts every offset into
    # several row blocks (partials reduced in block order).
    coords, (o, i, k) = _block_case()
    x = ml.SparseTensor(coords, mx.array(rng.standard_normal((len(coords), c_in)).astype(np.float32)))
    w = mx.zeros((c_out, 3, 3, 3, c_in))
    ct = mx.array(rng.standard_normal((len(coords), c_out)).astype(np.float32))
    ref = _weight_grad_across_threads(ops.subm_conv3d, x, w, ct)
    # per offset x[i]^T ct[o] over the oracle's edges, in float64
    xf, cf = np.array(x.feats).astype(np.float64), np.array(ct).astype(np.float64)
    e_dw = np.stack([cf[o[k == d]].T @ xf[i[k == d]] for d in range(27)], 1).reshape(c_out, 3, 3, 3, c_in)
    np.testing.assert_allclose(np.array(ref), e_dw, rtol=1e-4, atol=1e-4 * np.abs(e_dw).max())


@functools.lru_cache(maxsize=1)
def _sparse_then_dense_case():
    # 9,261 isolated voxels (3 apart: only the centre offset has edges) ahead
    # of a dense 20^3 cube, so the first row blocks hold no edge of 26 of the
    # 27 offsets: chunks without edges, whose partial sums must read as zero.
    g = np.arange(21) * 3
    isolated = np.stack(np.meshgrid(g, g, g, indexing="ij"), -1).reshape(-1, 3)
    d = np.arange(20) + 100
    dense = np.stack(np.meshgrid(d, d, d, indexing="ij"), -1).reshape(-1, 3)
    xyz = np.concatenate([isolated, dense])
    coords = np.concatenate([np.zeros((len(xyz), 1), np.int64), xyz], 1).astype(np.int32)
    return coords, np.asarray(oracle.conv_edges(coords, coords, 3, 1, 1)).T


@pytest.mark.parametrize("c_in,c_out", [(8, 16), (40, 20)])  # rows read in place; packed panels
def test_weight_gradient_chunks_without_edges(rng, isa, c_in, c_out):
    coords, (o, i, k) = _sparse_then_dense_case()
    ct = mx.array(rng.standard_normal((len(coords), c_out)).astype(np.float32))

    def grad(c):
        x = ml.SparseTensor(coords, mx.array(rng.standard_normal((len(coords), c)).astype(np.float32)))
        w = mx.zeros((c_out, 3, 3, 3, c))
        return x, mx.vjp(lambda w: ops.subm_conv3d(x, w).feats, [w], [ct])[1][0]

    x, dw = grad(c_in)
    mx.eval(dw)
    xf, cf = np.array(x.feats).astype(np.float64), np.array(ct).astype(np.float64)
    e_dw = np.stack([cf[o[k == d]].T @ xf[i[k == d]] for d in range(27)], 1).reshape(c_out, 3, 3, 3, c_in)
    np.testing.assert_allclose(np.array(dw), e_dw, rtol=1e-4, atol=1e-4 * np.abs(e_dw).max())
    # A wider problem in between leaves its values in the threads' panels;
    # the same problem again gives the same bits.
    mx.eval(grad(c_in + 4)[1])
    again = mx.vjp(lambda w: ops.subm_conv3d(x, w).feats, [mx.zeros((c_out, 3, 3, 3, c_in))], [ct])[1][0]
    assert _bytes(again) == _bytes(dw)


@functools.lru_cache(maxsize=2)
def _dense_cube(side):
    d = np.arange(side)
    xyz = np.stack(np.meshgrid(d, d, d, indexing="ij"), -1).reshape(-1, 3)
    coords = np.concatenate([np.zeros((len(xyz), 1), np.int64), xyz], 1).astype(np.int32)
    return coords, np.asarray(oracle.conv_edges(coords, coords, 3, 1, 1)).T


@pytest.mark.parametrize(
    "kernel,side,c_in,c_out",
    [
        (3, 22, 96, 96),  # 11 row blocks of 1,024 rows, two windows each
        (3, 22, 128, 128),  # the same with 32-edge sub-panels
        (3, 26, 32, 64),  # 9 row blocks of 2,048 rows, two windows each
        (3, 26, 40, 56),  # packed panels on AVX-512 (56 fills no vector), in place on AVX2
        (1, 26, 64, 128),  # one offset, edges are rows: 18 row blocks
    ],
)
def test_weight_gradient_whole_block_tasks(rng, isa, kernel, side, c_in, c_out):
    # Enough row blocks that a task takes a whole block (at least 4 per
    # thread), and on the direct path walks it in windows of result rows
    # across offsets: with 1 and 2 threads here, not with 3 (but for the
    # 1x1 layer), so the bits must match across both traversals, and the
    # oracle.
    coords, (o, i, k) = _dense_cube(side)
    x = ml.SparseTensor(coords, mx.array(rng.standard_normal((len(coords), c_in)).astype(np.float32)))
    w = mx.zeros((c_out, kernel, kernel, kernel, c_in))
    ct = mx.array(rng.standard_normal((len(coords), c_out)).astype(np.float32))
    conv = ops.subm_conv3d if kernel == 3 else ops.conv3d
    ref = _weight_grad_across_threads(conv, x, w, ct)
    xf, cf = np.array(x.feats).astype(np.float64), np.array(ct).astype(np.float64)
    if kernel == 3:
        e_dw = np.stack([cf[o[k == d]].T @ xf[i[k == d]] for d in range(27)], 1).reshape(w.shape)
    else:
        e_dw = (cf.T @ xf).reshape(w.shape)
    np.testing.assert_allclose(np.array(ref), e_dw, rtol=1e-4, atol=1e-4 * np.abs(e_dw).max())


@pytest.mark.skipif(len(FMA_PATHS) < 2, reason="needs two paths with fused multiply-adds (avx2 and avx512)")
@pytest.mark.parametrize("op,c_in,c_out,dtype", [
    ("subm", 24, 40, mx.float32), ("subm", 64, 64, mx.float32), ("subm", 96, 72, mx.float32),
    ("down", 32, 64, mx.float16), ("up", 48, 24, mx.bfloat16),
    # weight-gradient tiles oriented differently by the two paths: C_in in
    # AVX-512 vectors, C_out in AVX2 vectors (less padding), and 24 -> 40
    # above: C_out in AVX-512 vectors, C_in in AVX2's (equal padding, the
    # side contiguous in the gradient)
    ("subm", 20, 8, mx.float32), ("up", 36, 8, mx.float32),
    # 16-row weight-gradient tiles on AVX-512, 6-row ones on AVX2
    ("subm", 16, 16, mx.float32),
    # one output block over 16-64 input channels: the staged traversal on
    # AVX-512 (and on AVX2 at 16 outputs), block_product on AVX2
    ("subm", 32, 32, mx.float32), ("subm", 48, 48, mx.float16), ("down", 16, 32, mx.float32),
    ("up", 64, 48, mx.float32), ("subm", 32, 16, mx.bfloat16),
    # several blocks: two sharing a walk on AVX-512 (8 on AVX2), and blocks
    # of different widths, each walked on its own
    ("subm", 32, 128, mx.float32), ("subm", 64, 80, mx.float16),
])
def test_bitwise_across_fma_paths(rng, restore_isa, op, c_in, c_out, dtype):
    fn, feats, w, ct, _, _ = _conv_case(rng, op, c_in, c_out, dtype, n=2000, extent=20)
    results = {}
    for name in FMA_PATHS:
        _ext.set_cpu_isa(name)
        results[name] = [_bytes(a) for a in _run(fn, feats, w, ct)]
    for name in FMA_PATHS[1:]:
        assert results[name] == results[FMA_PATHS[0]], name


@pytest.mark.skipif("baseline" not in PATHS or not FMA_PATHS, reason="needs the x86-64 baseline and an FMA path")
def test_baseline_close_to_fma_paths(rng, restore_isa):
    fn, feats, w, ct, _, _ = _conv_case(rng, "subm", 40, 48, mx.float32, n=1500, extent=16)
    results = {}
    for name in ("baseline", FMA_PATHS[-1]):
        _ext.set_cpu_isa(name)
        results[name] = [np.array(a) for a in _run(fn, feats, w, ct)]
    for a, b in zip(*results.values()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(b).max()))


# Grouped products on each path: depthwise read in place (17/17/17), spread
# multiply-adds (12/8/4, 3/6/3), and groups of whole vectors of outputs with
# and without a tail on every path's width (34/34/2, 40/80/2, 64/128/4).
@pytest.mark.parametrize("op", ["subm", "conv3d", "transpose"])
@pytest.mark.parametrize("c_in,c_out,groups,dtype", [
    (17, 17, 17, mx.float32), (12, 8, 4, mx.float32), (3, 6, 3, mx.float16),
    (34, 34, 2, mx.float32), (40, 80, 2, mx.bfloat16), (64, 128, 4, mx.float32),
])
def test_grouped_matches_oracle(rng, isa, op, c_in, c_out, groups, dtype):
    x, w, fn, edges, perm = grouped_case(rng, op, c_in, c_out, groups, dtype)
    g = rng.standard_normal((len(perm), c_out)).astype(np.float32)
    ct = np.zeros_like(g)
    ct[perm] = g  # cotangent in the op's row order
    y, (dx, dw) = mx.vjp(lambda f, w: [fn(f, w).feats], [x.feats, w], [mx.array(ct).astype(dtype)])
    x_q, w_q, g_q = to_np(x.feats), to_np(w), to_np(mx.array(g).astype(dtype))
    full = oracle.expand_grouped(w_q, groups)
    e_dx, e_dw, _ = oracle.grads(edges, x_q, full, g_q)
    e_dw = oracle.compress_grouped(e_dw, groups)
    tol = TOLERANCES[dtype]
    np.testing.assert_allclose(to_np(y[0])[perm], oracle.apply(edges, x_q, full, len(perm)), **tol)
    np.testing.assert_allclose(to_np(dx), e_dx, **tol)
    np.testing.assert_allclose(to_np(dw), e_dw, rtol=tol["rtol"], atol=tol["atol"] * max(1.0, np.abs(e_dw).max()))


def _grouped_big(rng, c_in, c_out, groups, dtype):
    # > 2048 edges per offset: several weight-gradient partials per offset
    coords = oracle.random_coords(rng, 3000, 20, 2)
    x = ml.SparseTensor(coords, mx.array(rng.standard_normal((len(coords), c_in)).astype(np.float32)).astype(dtype))
    w = grouped_weight(rng, c_out, 3, c_in, groups, dtype)
    ct = mx.array(rng.standard_normal((len(coords), c_out)).astype(np.float32)).astype(dtype)
    return (lambda f, w: ops.subm_conv3d(x.replace(f), w, groups=groups).feats), x.feats, w, ct


@pytest.mark.parametrize("c_in,c_out,groups,dtype", [
    (48, 48, 48, mx.float32), (24, 48, 8, mx.float16), (64, 64, 2, mx.float32),
])
def test_grouped_bitwise_across_threads(rng, isa, c_in, c_out, groups, dtype):
    case = _grouped_big(rng, c_in, c_out, groups, dtype)
    ml.set_num_threads(1)
    ref = [_bytes(a) for a in _run(*case)]
    for n in (2, 5):
        ml.set_num_threads(n)
        assert [_bytes(a) for a in _run(*case)] == ref


@pytest.mark.skipif(len(FMA_PATHS) < 2, reason="needs two paths with fused multiply-adds (avx2 and avx512)")
# (34/34/2, 40/80/2: outputs of a group in whole vectors on one path and in
# a scalar tail on the other, which must fuse alike)
@pytest.mark.parametrize("c_in,c_out,groups", [(48, 48, 48), (24, 48, 8), (64, 64, 2), (34, 34, 2), (40, 80, 2)])
def test_grouped_bitwise_across_fma_paths(rng, restore_isa, c_in, c_out, groups):
    case = _grouped_big(rng, c_in, c_out, groups, mx.float32)
    results = {}
    for name in FMA_PATHS:
        _ext.set_cpu_isa(name)
        results[name] = [_bytes(a) for a in _run(*case)]
    for name in FMA_PATHS[1:]:
        assert results[name] == results[FMA_PATHS[0]], name


# Patch attention on each path: head dims around each path's vector width,
# patches crossing the query and key blocks, padded and empty patches.
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize("d,p", [(3, 1), (8, 33), (24, 150), (40, 70)])
def test_attention_matches_oracle(rng, isa, dtype, d, p):
    q, k, v = attention_inputs(rng, 4, 2, p, d, dtype)
    n = attention_lengths(rng, 4, p)
    scale = 0.7 * d ** -0.5
    do = mx.array(rng.standard_normal(q.shape).astype(np.float32)).astype(dtype)
    dlse = mx.array(rng.standard_normal(q.shape[:3]).astype(np.float32))
    o, lse = _ext.patch_attention(q, k, v, mx.array(n), scale)
    got = attention_grads(q, k, v, n, scale, do, dlse)
    ro, rl, *want = dense_attention(to_np(q), to_np(k), to_np(v), n, scale, to_np(do), np.array(dlse))
    tol = dict(rtol=1e-4, atol=2e-5) if dtype == mx.float32 else TOLERANCES[dtype]
    np.testing.assert_allclose(to_np(o), ro, **tol)
    np.testing.assert_allclose(np.array(lse), rl, rtol=1e-5, atol=1e-5)
    for g, w in zip(got, want):
        assert g.dtype == dtype
        np.testing.assert_allclose(to_np(g), w, **tol)


def test_attention_bitwise_across_threads(rng, isa):
    q, k, v = attention_inputs(rng, 3, 2, 200, 24)
    n = np.array([200, 130, 77], np.int32)
    do = mx.array(rng.standard_normal(q.shape).astype(np.float32))
    runs = []
    for t in (1, 2, 5):
        ml.set_num_threads(t)
        o, lse = _ext.patch_attention(q, k, v, mx.array(n), 0.2)
        runs.append([_bytes(a) for a in (o, lse, *attention_grads(q, k, v, n, 0.2, do))])
    assert runs[1] == runs[0] and runs[2] == runs[0]


# The fused norms on each path: row vectors with a tail (67, 19 channels),
# residual and leaky slopes, every dtype, and thread counts.
@pytest.mark.parametrize("act,residual", [("relu", False), ("leaky", True), ("none", True)])
def test_norm_values(rng, isa, act, residual):
    norm_values(rng, act, residual, 1000, 67)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("kind", ["batch", "instance"])
def test_norm_gradients(rng, isa, dtype, kind):
    norm_matches_op_path(rng, dtype, kind)


def test_norm_bitwise_across_threads(rng, isa):
    norm_bitwise_across_threads(rng)


@pytest.mark.skipif(len(FMA_PATHS) < 2, reason="needs two paths with fused multiply-adds (avx2 and avx512)")
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_norm_bitwise_across_fma_paths(rng, restore_isa, dtype):
    x = norm_tensor(rng, 3000, 45, batch=2, dtype=dtype)
    r = mx.array(rng.standard_normal((3000, 45)).astype(np.float32)).astype(dtype)
    results = {}
    for name in FMA_PATHS:
        _ext.set_cpu_isa(name)
        bn = nn.BatchNorm(45)

        def loss(f, res):
            y = nn.norm_act(bn, x.replace(f), nn.LeakyReLU(0.1), res).feats
            return (y.astype(mx.float32) ** 2).sum(), y

        (_, y), grads = mx.value_and_grad(loss, argnums=[0, 1])(x.feats, r)
        results[name] = [_bytes(a) for a in (y, *grads, bn.running_mean, bn.running_var)]
    for name in FMA_PATHS[1:]:
        assert results[name] == results[FMA_PATHS[0]], name


def _tool_output(name, *args):
    """stdout of a binutils tool run on the extension; skips where the tool
    is missing, fails (with its error) where it does not succeed."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} (binutils) not installed")
    out = subprocess.run([path, *args, _ext.__file__], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{name} exited {out.returncode}:\n{out.stderr[-2000:]}"
    return out.stdout


def test_extension_carries_every_path():
    # Each path's entry points are in the extension's symbol table.
    out = _tool_output("nm", "-C")
    for name in _ext.built_cpu_isas():
        for fn in ("gather_conv", "gather_conv_quantized", "weight_grad", "grouped_conv",
                   "grouped_weight_grad", "attention_forward", "attention_backward",
                   "norm_forward", "norm_backward"):
            assert f"mlx_lattice::cpu::{name}::{fn}(" in out, (name, fn)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 only")
def test_wide_vectors_only_in_their_paths():
    # Code outside the avx2/avx512 namespaces never touches ymm/zmm registers,
    # so the baseline path never executes AVX (no shared inline function was
    # compiled for a wider instruction set), unless built with
    # MLX_LATTICE_NATIVE.
    dis = _tool_output("objdump", "-d", "--no-show-raw-insn", "-C")
    # the avx2 and avx512 paths fuse their multiply-adds (simd::fma)
    assert "vfmadd" in dis, f"objdump's disassembly has no FMA instruction: {dis[:500]!r}"
    owner, offenders, wide = None, set(), {"avx2": 0, "avx512": 0}
    for line in dis.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            owner = m.group(1)
            continue
        if owner is None or "%ymm" not in line and "%zmm" not in line:
            continue
        path = re.search(r"mlx_lattice::cpu::(avx2|avx512)::", owner)
        if path:
            wide[path.group(1)] += "%zmm" in line
        else:
            offenders.add(owner)
    if not _ext.CPU_NATIVE_BUILD:
        assert not offenders, sorted(offenders)[:5]
    assert wide["avx2"] == 0
    assert (wide["avx512"] > 0) == ("avx512" in _ext.built_cpu_isas())
