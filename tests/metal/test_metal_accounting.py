"""Harness accounting: the multiply-adds each dispatch does on the matrix
units (simdgroup_multiply_accumulate and TensorOps matmul2d, counted by the
shim per thread), and the threadgroup memory and threads it uses. A route the registry marks as a
matrix-unit route must do at least 95% of its call's useful multiply-adds
(edges x C_in x C_out) there, and every dispatch of it stays within Apple
GPUs' 32 KiB of threadgroup memory and 1024 threads. The counts exist only
in the harness; on a Mac's GPU this module skips."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_lattice import routes

import metal_harness as mh
import metal_programs
from metal_programs import relation

pytestmark = [*metal_programs.MARKS, pytest.mark.skipif(
    metal_programs.BACKEND != "metal-harness", reason="the counts are the harness's (CPU emulation)")]

TG_LIMIT = 32 * 1024
THREADS_LIMIT = 1024


def _within_limits(log):
    assert log, "no dispatch ran"
    for d in log:
        assert d.threadgroup_bytes <= TG_LIMIT, d
        assert d.threads <= THREADS_LIMIT, d


def _operands(rng, rows, c_in, c_out, k, dtype):
    x = mx.array(rng.standard_normal((rows, c_in)).astype(np.float32)).astype(dtype)
    w = mx.array(rng.standard_normal((k, c_in, c_out)).astype(np.float32)).astype(dtype)
    return x, w


@pytest.mark.parametrize("route,direction,c_in,c_out,dtype", [
    ("metal.csr_mma", "forward", 24, 40, mx.float32),
    ("metal.csr_mma", "forward", 96, 128, mx.bfloat16),
    ("metal.csr_mma", "dgrad", 40, 24, mx.float16),
    ("metal.sorted_gemm", "forward", 32, 32, mx.float16),
    ("metal.tensorops_sorted", "forward", 64, 64, mx.float16),
    ("metal.tensorops_dgrad", "dgrad", 16, 16, mx.float32),
    # the seed routes' own kernels, on simdgroup matrices since
    ("metal.dense_channel", "forward", 32, 64, mx.float32),
    ("metal.dense_channel", "forward", 64, 64, mx.float16),
    ("metal.dense_channel", "forward", 16, 16, mx.float16),
    ("metal.dgrad_dense_channel", "dgrad", 64, 16, mx.float16),
    ("metal.dgrad_dense_grouped", "dgrad", 64, 64, mx.float32),
    ("metal.dgrad_dense_grouped", "dgrad", 16, 32, mx.float16),
    ("metal.cout16", "forward", 24, 16, mx.float32),
    ("metal.cout16", "dgrad", 13, 16, mx.float16),
    ("metal.tensorops_csr_mma", "forward", 24, 40, mx.float32),
    ("metal.tensorops_csr_mma", "forward", 8, 8, mx.float16),
    ("metal.tensorops_csr_mma", "forward", 96, 128, mx.bfloat16),
    ("metal.tensorops_csr_mma", "forward", 256, 64, mx.float16),
    ("metal.tensorops_csr_mma", "dgrad", 40, 24, mx.float16),
    ("metal.tensorops_csr_mma", "dgrad", 128, 256, mx.bfloat16),
])
def test_convolution_routes_multiply_on_matrix_units(rng, route, direction, c_in, c_out, dtype):
    assert routes.get(route).matrix_unit
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 300, 3)
    k = rel.kernel_volume
    if direction == "forward":
        x, w = _operands(rng, rows_in, c_in, c_out, k, dtype)
        view = metal_programs.OUTPUT_MAJOR
    else:  # the input gradient: the same product over the input-major view
        x, w = _operands(rng, n_out, c_in, c_out, k, dtype)
        view = metal_programs.INPUT_MAJOR
    with mh.dispatches() as log:
        metal_programs.conv(route, x, w, rel._native, view)
    useful = len(edges) * c_in * c_out
    counted = sum(d.matrix_macs for d in log)
    assert counted >= 0.95 * useful, (counted, useful)
    _within_limits(log)


@pytest.mark.parametrize("c_in,c_out,dtype", [(7, 1, mx.float32), (64, 64, mx.float16), (40, 130, mx.float32)])
def test_pointwise_multiplies_on_matrix_units(rng, c_in, c_out, dtype):
    assert routes.get("metal.pointwise").matrix_unit
    rows = 300
    x, w = _operands(rng, rows, c_in, c_out, 1, dtype)
    with mh.dispatches() as log:
        metal_programs.conv("metal.pointwise", x, w, None)
    assert sum(d.matrix_macs for d in log) >= 0.95 * rows * c_in * c_out
    _within_limits(log)


@pytest.mark.parametrize("route,c_in,c_out,dtype", [
    ("metal.wgrad_mma", 24, 40, mx.float32),
    ("metal.wgrad_mma", 64, 96, mx.bfloat16),
    ("metal.tensorops_wgrad", 32, 64, mx.float16),
    ("metal.tensorops_wgrad_mma", 24, 40, mx.float32),
    ("metal.tensorops_wgrad_mma", 8, 8, mx.float16),
    ("metal.tensorops_wgrad_mma", 96, 128, mx.bfloat16),
    ("metal.tensorops_wgrad_mma", 256, 64, mx.float16),
])
def test_weight_gradient_multiplies_on_matrix_units(rng, route, c_in, c_out, dtype):
    assert routes.get(route).matrix_unit
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 300, 3)
    k = rel.kernel_volume
    x = mx.array(rng.standard_normal((rows_in, c_in)).astype(np.float32)).astype(dtype)
    ct = mx.array(rng.standard_normal((n_out, c_out)).astype(np.float32)).astype(dtype)
    with mh.dispatches() as log:
        metal_programs.weight_grad(route, x, ct, rel._native, k)
    useful = len(edges) * c_in * c_out
    assert sum(d.matrix_macs for d in log) >= 0.95 * useful
    _within_limits(log)


@pytest.mark.parametrize("direction,ag,bg,groups,dtype", [
    ("forward", 8, 8, 4, mx.float32),
    ("forward", 24, 40, 2, mx.bfloat16),
    ("dgrad", 16, 12, 3, mx.float16),
    ("wgrad", 8, 8, 4, mx.float16),
    ("wgrad", 40, 24, 2, mx.bfloat16),
    ("wgrad", 64, 64, 2, mx.float32),
])
def test_grouped_routes_multiply_on_matrix_units(rng, direction, ag, bg, groups, dtype):
    """Grouped products: useful multiply-adds edges x C_in / G x C_out."""
    route = "metal.grouped_wgrad_mma" if direction == "wgrad" else "metal.grouped_csr_mma"
    assert routes.get(route).matrix_unit and routes.get(route).grouped
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 300, 3)
    k = rel.kernel_volume
    c_in, c_out = ag * groups, bg * groups
    with mh.dispatches() as log:
        if direction == "wgrad":
            x = mx.array(rng.standard_normal((rows_in, c_in)).astype(np.float32)).astype(dtype)
            ct = mx.array(rng.standard_normal((n_out, c_out)).astype(np.float32)).astype(dtype)
            metal_programs.weight_grad(route, x, ct, rel._native, k, groups=groups)
        elif direction == "forward":
            x, w = _operands(rng, rows_in, c_in, c_out, k, dtype)
            metal_programs.conv(route, x, w[:, :ag], rel._native, groups=groups)
        else:  # the input gradient: (K, C_out / G, C_in) over the input-major view
            x, w = _operands(rng, n_out, c_in, c_out, k, dtype)
            metal_programs.conv(route, x, w[:, :ag], rel._native, metal_programs.INPUT_MAJOR, groups=groups)
    useful = len(edges) * ag * c_out
    assert sum(d.matrix_macs for d in log) >= 0.95 * useful
    _within_limits(log)


def test_scalar_routes_count_no_matrix_work(rng):
    # the counter is the matrix units': a scalar route's product counts none
    assert not routes.get("metal.fetch_on_demand").matrix_unit
    rel, rows_in, n_out, edges = relation(rng, "submanifold", 200, 3)
    x, w = _operands(rng, rows_in, 8, 8, rel.kernel_volume, mx.float32)
    with mh.dispatches() as log:
        metal_programs.conv("metal.fetch_on_demand", x, w, rel._native)
    assert sum(d.matrix_macs for d in log) == 0
    _within_limits(log)


# A sparse LiDAR sweep: 16 beams x 256 azimuths at 20 cm, 3481 voxels. Its
# rows' offset sets vary along the scan lines, so 32 consecutive rows
# multiply far more offsets than they have edges; tiles of the row order
# (rows sorted by offset set) pad little. Executed / useful multiply-adds of
# metal.csr_mma at C_in = C_out = 16 (no channel padding; the dense-channel
# kernels do the same on this relation), measured with
# 32 consecutive rows per tile -> with the row order:
#   submanifold K = 27: forward 4.97 -> 2.23, input gradient 4.97 -> 2.24
#   k2s2 K = 8:         forward 5.30 -> 1.44, input gradient 6.89 -> 1.07
LIDAR_PADDING = [
    ("submanifold", "forward", 2.5), ("submanifold", "dgrad", 2.5),
    ("down", "forward", 1.7), ("down", "dgrad", 1.3),
]


@pytest.fixture(scope="module")
def lidar_relations():
    import mlx_lattice as ml
    from mlx_lattice import scenes
    from mlx_lattice.relation import KernelGeometry

    pts, _ = scenes.lidar_sweep(seed=0, beams=16, azimuth_steps=256)
    coords = scenes.voxelize_points(pts, 0.2)
    x = ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32))
    m, s = x.manager, x.coordinate_set
    subm = m.submanifold_kernel_relation(s, KernelGeometry((3,) * 3, (1,) * 3, (1,) * 3, (1,) * 3))
    down, _ = m.kernel_relation(s, KernelGeometry((2,) * 3, (2,) * 3, (0,) * 3, (1,) * 3))
    return {"submanifold": subm._native, "down": down._native}


@pytest.mark.parametrize("kind,direction,bound", LIDAR_PADDING)
@pytest.mark.parametrize("family", ["csr_mma", "dense"])
def test_matrix_unit_tiles_pad_little_on_a_lidar_sweep(rng, lidar_relations, family, kind, direction, bound):
    """metal.csr_mma's (and the dense-channel kernels') matrix-unit
    multiply-adds stay within `bound` x the useful ones on a LiDAR sweep,
    both views: tiles of 32 consecutive rows (the view's natural order)
    would do 4.97-6.89 x."""
    route = {"csr_mma": "metal.csr_mma", "dense": "metal.dense_channel"}[family]
    if family == "dense" and direction == "dgrad":
        route = "metal.dgrad_dense_channel"
    rel = lidar_relations[kind]
    k = rel.kernel_volume
    view = metal_programs.OUTPUT_MAJOR if direction == "forward" else metal_programs.INPUT_MAJOR
    rows_in = rel.n_in if direction == "forward" else rel.n_out
    x, w = _operands(rng, rows_in, 16, 16, k, mx.float16)
    with mh.dispatches() as log:
        metal_programs.conv(route, x, w, rel, view)
    useful = rel.edges * 16 * 16
    counted = sum(d.matrix_macs for d in log)
    assert useful <= counted <= bound * useful, (counted / useful, bound)
    _within_limits(log)
