"""Neighbour queries on CUDA (mlx_lattice/backends/cuda/neighbors.py) against the
CPU search and brute force.

On a CUDA GPU (the default device set to it) ``neighbors.knn`` and
``neighbors.radius`` run the CUDA kernels; their offsets, indices and
distances must equal the CPU's (``_ext.knn_query`` / ``radius_query``)
element for element: the kernels compute squared distances in float64 in
the CPU's operation order, so ties (by index) and the inclusive radius
boundary agree exactly. Cases: voxel and float points, batches (with query
items that hold no points), k above the points of an item, empty sets,
points on the radius, duplicates, far coordinates. Without CUDA these are
skipped; the grid parameters (shared with the Metal programs) and, where
nvcc is installed, a compile check of the kernel sources run anywhere.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import mlx.core as mx

from mlx_lattice import _ext, diagnostics
from mlx_lattice import neighbors as nb

from conftest import needs_cuda

SOURCE = Path(__file__).resolve().parents[1] / "mlx_lattice" / "backends" / "cuda" / "neighbors.py"


def brute(q, qb, p, pb, k=0, r=0.0):
    """Per query: [(squared distance float64, index)] sorted, own item only."""
    q, p = np.asarray(q, np.float64).reshape(-1, 3), np.asarray(p, np.float64).reshape(-1, 3)
    out = []
    for i in range(len(q)):
        same = np.nonzero(np.asarray(pb) == qb[i])[0]
        d = q[i] - p[same]
        d2 = (d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1]) + d[:, 2] * d[:, 2]
        hits = sorted(zip(d2.tolist(), same.tolist()))
        if r:
            hits = [h for h in hits if h[0] <= r * r]
        out.append(hits[:k] if k else hits)
    return out


def cpu(q, qb, p, pb, k=0, r=0.0):
    args = [mx.array(np.ascontiguousarray(a)) for a in (q, qb, p, pb)]
    with mx.stream(mx.cpu):
        out = _ext.knn_query(*args, k) if r == 0 else _ext.radius_query(*args, float(r), k)
        return tuple(np.array(a) for a in out)


def check(q, qb, p, pb, k=0, r=0.0):
    """The GPU relation of nb.knn / nb.radius equals the CPU's arrays and
    the brute-force neighbours."""
    with diagnostics.record() as log:
        if r == 0:
            rel = nb.knn(q, p, k, query_batch=qb, point_batch=pb)
        else:
            rel = nb.radius(q, p, r, query_batch=qb, point_batch=pb, max_neighbors=k or None)
    # the GPU's route ran (the default device must be a CUDA GPU here)
    assert [e["route"] for e in log] == ["cuda.knn" if r == 0 else "cuda.radius"]
    got = tuple(np.array(a) for a in rel)
    want = cpu(q, qb, p, pb, k, r)
    for g, w, name in zip(got, want, ("offsets", "indices", "distances")):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        np.testing.assert_array_equal(g, w, err_msg=name)
    off, idx = got[0], got[1]
    for i, hits in enumerate(brute(q, qb, p, pb, k, r)):
        assert idx[off[i]:off[i + 1]].tolist() == [j for _, j in hits], f"query {i}"
    return got


def voxels(rng, n, extent, batches):
    return (rng.integers(-extent, extent, (n, 3)).astype(np.float32),
            np.sort(rng.integers(0, batches, n)).astype(np.int32))


@needs_cuda
@pytest.mark.parametrize("k", [1, 6, 40])
def test_knn_voxels(on_gpu, k):
    rng = np.random.default_rng(k)
    p, pb = voxels(rng, 400, 6, 3)
    q, qb = voxels(rng, 200, 7, 4)  # item 3 has no points
    off = check(q, qb, p, pb, k=k)[0]
    np.testing.assert_array_equal(np.diff(off), np.minimum(k, np.bincount(pb, minlength=4)[qb]))


@needs_cuda
@pytest.mark.parametrize("r,cap", [(1.0, 0), (2 ** 0.5, 0), (3.0, 0), (2.0, 5)])
def test_radius_voxels_boundary(on_gpu, r, cap):
    rng = np.random.default_rng(int(r * 10) + cap)
    p, pb = voxels(rng, 300, 4, 2)
    q, qb = voxels(rng, 120, 5, 3)
    dist = check(q, qb, p, pb, k=cap, r=r)[2]
    assert np.isclose(dist.astype(np.float64), r, rtol=1e-6).any(), "the case must put points on the radius"


@needs_cuda
def test_float_points_and_duplicates(on_gpu):
    rng = np.random.default_rng(7)
    p = (rng.standard_normal((500, 3)) * 2.5).astype(np.float32)
    p[250:280] = p[:30]  # exact duplicates tie by index
    pb = rng.integers(0, 2, 500).astype(np.int32)
    pb[250:280] = pb[:30]
    q = np.concatenate([p[:50], (rng.standard_normal((80, 3)) * 3).astype(np.float32)])
    qb = rng.integers(0, 2, 130).astype(np.int32)
    qb[:50] = pb[:50]
    check(q, qb, p, pb, k=9)
    check(q, qb, p, pb, r=0.9)
    check(q, qb, p, pb, k=4, r=1.7)


@needs_cuda
def test_far_and_flat_sets(on_gpu):
    rng = np.random.default_rng(8)
    p = (rng.uniform(0, 1, (200, 3)) * 3 + 1e4).astype(np.float32)
    p[0] = [-1e4, 0, 0]
    pb = np.zeros(200, np.int32)
    check(p[:60], pb[:60], p, pb, r=0.5)
    check(p[:60], pb[:60], p, pb, k=5)
    line = np.stack([np.arange(50), np.zeros(50), np.zeros(50)], 1).astype(np.float32)
    lb = np.zeros(50, np.int32)
    q = np.array([[3, 1, 0], [-4, 0, 0], [60, 2, 2]], np.float32)
    check(q, np.zeros(3, np.int32), line, lb, k=4)
    check(q, np.zeros(3, np.int32), line[:1], lb[:1], k=3)


@needs_cuda
def test_sparse_batch_indices(on_gpu):
    rng = np.random.default_rng(6)
    p, _ = voxels(rng, 20, 3, 1)
    pb = np.array([0] * 5 + [700] * 10 + [2500] * 5, np.int32)
    q, _ = voxels(rng, 12, 3, 1)
    qb = np.array([0, 700, 2500, 3, 9999, 700] * 2, np.int32)
    check(q, qb, p, pb, k=4)
    check(q, qb, p, pb, r=2.0)


@needs_cuda
def test_empty_sets_and_k_above_points(on_gpu):
    rng = np.random.default_rng(5)
    p, pb = voxels(rng, 9, 2, 2)
    q, qb = voxels(rng, 12, 2, 3)
    check(q, qb, p, pb, k=50)
    e3, e1 = np.zeros((0, 3), np.float32), np.zeros(0, np.int32)
    for k, r in ((3, 0.0), (0, 1.5), (2, 1.5)):
        check(e3, e1, p, pb, k=k, r=r)
        assert check(q, qb, e3, e1, k=k, r=r)[0].tolist() == [0] * (len(q) + 1)
        check(e3, e1, e3, e1, k=k, r=r)


@needs_cuda
def test_cpu_default_device_stays_on_cpu():
    previous = mx.default_device()
    mx.set_default_device(mx.cpu)
    p = np.array([[0, 0, 0], [1, 0, 0], [0, 3, 0]], np.float32)
    try:
        with diagnostics.record() as log:
            nb.knn(p, p, 2)
            nb.radius(p, p, 1.5)
    finally:
        mx.set_default_device(previous)
    assert [e["route"] for e in log] == ["cpu.knn", "cpu.radius"]


def test_grid_parameters():
    """The grid both GPU backends use: every cell addressable, at most
    max(2N, 64, batch items) cells, cells per axis within 2^20 of the origin."""
    rng = np.random.default_rng(2)
    for n, scale, k, r in ((300, 1.0, 8, 0.0), (300, 1e4, 0, 1e-3), (5, 1.0, 3, 0.0), (0, 1.0, 0, 2.0)):
        p = mx.array((rng.standard_normal((n, 3)) * scale).astype(np.float32))
        pb = mx.array(rng.integers(0, 3, n).astype(np.int32))
        g = _ext.neighbor_grid(p, pb, p, pb, k, r)
        n_batch = int(np.array(pb).max()) + 1 if n else 0
        assert g["n_batch"] == n_batch
        assert g["n_cells"] == n_batch * int(np.prod(g["dims"]))
        assert g["n_cells"] <= max(2 * n, 64, n_batch)
        assert all(1 <= d <= 2 ** 20 + 1 for d in g["dims"])
        if r:
            assert g["cell"] >= np.float32(r)
        assert g["exact"] == (n == 0)  # random floats are not integral
    sparse_items = mx.array(np.array([0, 999, 999, 4000], np.int32))  # more items than 2N or 64
    g = _ext.neighbor_grid(mx.zeros((4, 3)), sparse_items, mx.ones((4, 3)), sparse_items, 2)
    assert g["n_batch"] == 4001 and g["n_cells"] == 4001
    v = mx.array(rng.integers(-9, 9, (40, 3)).astype(np.float32))
    assert _ext.neighbor_grid(v, mx.zeros((40,), mx.int32), v, mx.zeros((40,), mx.int32), 4)["exact"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_kernel_sources_compile(tmp_path):
    """Each kernel body, wrapped in a __global__ function with the
    arguments mx.fast.cuda_kernel gives it, compiles with nvcc."""
    ns: dict = {}
    for node in ast.parse(SOURCE.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Constant, ast.Dict)):
            exec(compile(ast.Module([node], []), str(SOURCE), "exec"), ns)
    floats = {"pts", "qs", "fp", "distances"}
    unit = ["#include <cuda_runtime.h>", ns["COMMON"]]
    for name, (ins, outs, body) in ns["KERNELS"].items():
        args = [f"const {'float' if a in floats else 'int'}* {a}" for a in ins]
        args += [f"{'float' if a in floats else 'int'}* {a}" for a in outs]
        unit.append(f"__global__ void nbr_{name}({', '.join(args)}) {{\n{body}\n}}")
    cu = tmp_path / "neighbors.cu"
    cu.write_text("\n".join(unit))
    run = subprocess.run(["nvcc", "-std=c++17", "-c", str(cu), "-o", str(tmp_path / "neighbors.o")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
