"""What a layer needs beyond the relation, built on CUDA (mlx_lattice/backends/cuda/
plans.py), against the CPU relation's arrays: expanded rows, kernel-major and
input-major views, the swapped relation, the sorted plan; the weight-gradient
chunks against a NumPy walk over the kernel-major offsets."""

import numpy as np
import pytest
import mlx.core as mx

from mlx_lattice import _ext
from mlx_lattice.backends import cuda
from mlx_lattice.relation import KernelGeometry, Relation

from conftest import assert_same, needs_cuda, voxel_cloud

pytestmark = needs_cuda

if cuda.available():
    from mlx_lattice.backends.cuda import maps, plans


def same_views(g: Relation, c: Relation):
    assert g.backend == "cuda" and c.backend == "cpu"
    assert (g.kind, g.n_in, g.n_out, g.kernel_volume, g.edges) == (
        c.kind, c.n_in, c.n_out, c.kernel_volume, c.edges)
    for name in ("out_offsets", "in_idx", "k_idx", "out_idx", "neighbor_map"):
        assert_same(getattr(g, name), getattr(c, name))
    for a, b in zip(vars(g.input_major()).values(), vars(c.input_major()).values()):
        assert_same(a, b)
    for a, b in zip(vars(g.kernel_major()).values(), vars(c.kernel_major()).values()):
        assert_same(a, b)
    assert g.stats() == c.stats()  # max_neighbors read with the size, not from host arrays
    if c.kernel_volume <= 64:
        gp, cp = g.sorted_plan(), c.sorted_plan()
        for name in ("reorder_rows", "sorted_out_in_map", "sorted_kv_out_in_map", "tile_masks"):
            assert_same(getattr(gp, name), getattr(cp, name))
    else:
        with pytest.raises(ValueError, match="at most 64"):
            g.sorted_plan()


def pair(coords, out, geometry, transposed, kind):
    geom = KernelGeometry(*geometry)
    g, max_out, max_in, _ = maps.build(maps.CudaTable(coords), out, geometry, transposed, kind)
    c = _ext.build_relation(_ext.CoordTable(coords), out, *geometry, transposed, kind)
    return Relation(g, geom, "cuda", cuda.Plans(g), max_neighbors=max_out, max_in_neighbors=max_in), Relation(c, geom)


GEOMETRIES = [
    ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1)),  # K = 27: one sort pass
    ((3, 3, 5), (1, 1, 1), (1, 1, 2), (1, 1, 1)),  # K = 45: two passes
    ((4, 4, 4), (1, 1, 1), (1, 1, 1), (1, 1, 1)),  # K = 64: every mask bit
    ((5, 5, 5), (1, 1, 1), (2, 2, 2), (1, 1, 1)),  # K = 125: no sorted plan
    ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1)),
    ((3, 2, 1), (2, 3, 1), (1, 0, 0), (1, 2, 1)),
]


@pytest.mark.parametrize("n", [0, 1, 400])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_views_equal_cpu(rng, n, geometry):
    coords = voxel_cloud(rng, n, batches=3, extent=10) if n else mx.zeros((0, 4), mx.int32)
    mx.eval(coords)
    sub = pair(coords, coords, geometry, False, "submanifold")
    same_views(*sub)
    fwd = pair(coords, _ext.forward_support(_ext.CoordTable(coords), *geometry), geometry, False, "forward")
    same_views(*fwd)
    target = voxel_cloud(rng, 150, batches=4, extent=10)  # rows outside the batch range reach nothing
    same_views(*pair(coords, target, geometry, False, "target"))
    for g, c in (sub, fwd):
        gs = g.swapped("transposed", g.geometry)
        cs = c.swapped("transposed", c.geometry)
        same_views(gs, cs)
        assert_same(gs.neighbor_map, c._native.input_neighbor_map)
        # Swapping twice gives the relation back.
        same_views(gs.swapped(g.kind, g.geometry), c)


def chunk_oracle(koffsets, size):
    off = np.array(koffsets)
    rows, first = [], [0]
    for k in range(len(off) - 1):
        for e in range(int(off[k]), int(off[k + 1]), size):
            rows.append((k, e, min(e + size, int(off[k + 1]))))
        first.append(len(rows))
    return np.array(rows, dtype=np.int32).reshape(-1, 3), np.array(first, dtype=np.int32)


@pytest.mark.parametrize("size", [1, 7, 256])
def test_wgrad_chunks(rng, size):
    coords = voxel_cloud(rng, 3000, extent=12)
    geometry = ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    g, c = pair(coords, coords, geometry, False, "submanifold")
    chunks, first = plans.wgrad_chunks(g.kernel_major().offsets, g.edges, g.kernel_volume, size)
    want, want_first = chunk_oracle(c.kernel_major().offsets, size)
    assert_same(first, want_first)
    chunks = np.array(chunks)
    assert chunks.shape[0] >= len(want)
    np.testing.assert_array_equal(chunks[: len(want)], want)
    np.testing.assert_array_equal(chunks[len(want):], np.tile([-1, 0, 0], (len(chunks) - len(want), 1)))


def test_large_cloud_views(rng):
    coords = voxel_cloud(rng, 60000, batches=2, extent=40)
    geometry = ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    same_views(*pair(coords, coords, geometry, False, "submanifold"))


def test_manager_relations_are_gpu(rng):
    from mlx_lattice.manager import CoordinateManager

    previous = mx.default_device()
    mx.set_default_device(mx.gpu)
    try:
        m = CoordinateManager()
        s = m.register(voxel_cloud(rng, 500, extent=10))
        geom = KernelGeometry((2, 2, 2), (2, 2, 2))
        rel, out = m.kernel_relation(s, geom)
        up, _ = m.transposed_kernel_relation(out, geom)  # the forward relation swapped
        assert rel.backend == "cuda" and up.backend == "cuda"
        # The decoder's relation, both input gradients and the swaps back
        # share two sets of derived arrays.
        assert up._views is rel.swapped("forward", geom)._views
        assert cuda.view_of(up).flipped().rel._views is rel._views
        assert cuda.view_of(rel).flipped().rel._views is up._views
        assert cuda.view_of(up).flipped().plan().tile_masks is cuda.view_of(rel).plan().tile_masks
        c = Relation(_ext.build_relation(_ext.CoordTable(s.coords), out.coords, *geom.args(), False, "forward"), geom)
        same_views(up, c.swapped("transposed", geom))
    finally:
        mx.set_default_device(previous)
