"""Map building on CUDA against the CPU builder: equal arrays, element for
element, on every kind, stride, dilation, padding, batch and the empty case."""

import numpy as np
import pytest
import mlx.core as mx

from mlx_lattice import _ext
from mlx_lattice.backends import cuda
from mlx_lattice.manager import CoordinateManager

from conftest import assert_same, needs_cuda, voxel_cloud

pytestmark = needs_cuda

if cuda.available():
    from mlx_lattice.backends.cuda import maps


def same_relation(g, c):
    g, c = getattr(g, "_native", g), getattr(c, "_native", c)  # the native arrays
    # A GPU-built relation's arrays may still be in flight: the native
    # relation's own host reads (out_idx, the views) need them evaluated.
    mx.eval(g.out_offsets, g.in_idx, g.k_idx, g.neighbor_map)
    assert (g.kind, g.n_in, g.n_out, g.kernel_volume, g.edges) == (
        c.kind, c.n_in, c.n_out, c.kernel_volume, c.edges)
    for name in ("out_offsets", "in_idx", "k_idx", "out_idx", "neighbor_map", "input_neighbor_map"):
        assert_same(getattr(g, name), getattr(c, name))
    for a, b in zip(g.input_major(), c.input_major()):
        assert_same(a, b)
    for a, b in zip(g.kernel_major(), c.kernel_major()):
        assert_same(a, b)
    if c.kernel_volume <= 64:
        for a, b in zip(g.sorted_plan(), c.sorted_plan()):
            assert_same(a, b)


GEOMETRIES = [
    # kernel, stride, padding, dilation
    ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1)),
    ((5, 5, 5), (1, 1, 1), (2, 2, 2), (1, 1, 1)),
    ((3, 3, 3), (1, 1, 1), (2, 2, 2), (2, 2, 2)),
    ((2, 2, 2), (1, 1, 1), (0, 0, 0), (1, 1, 1)),
    ((3, 1, 3), (1, 1, 1), (0, 0, 0), (1, 1, 1)),
    ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1)),
    ((3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1)),
    ((3, 2, 1), (2, 3, 1), (1, 0, 0), (1, 2, 1)),
]


@pytest.fixture(params=["hash", "sort"])
def dedup(request, monkeypatch):
    """Both ways supports deduplicate their candidates."""
    monkeypatch.setattr(maps, "SUPPORT_DEDUP", request.param)
    return request.param


@pytest.mark.parametrize("n", [0, 1, 300])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_relations_equal_cpu(rng, n, geometry, dedup):
    coords = voxel_cloud(rng, n, batches=3) if n else mx.zeros((0, 4), mx.int32)
    mx.eval(coords)
    cpu_table = _ext.CoordTable(coords)
    gpu_table = maps.CudaTable(coords)
    # Submanifold-style onto the same array (the symmetric path where it applies).
    same_relation(
        maps.build_relation(gpu_table, coords, geometry, False, "submanifold"),
        _ext.build_relation(cpu_table, coords, *geometry, False, "submanifold"),
    )
    # Forward: the output support and the relation onto it.
    fwd_gpu = maps.forward_support(gpu_table, geometry)
    fwd_cpu = _ext.forward_support(cpu_table, *geometry)
    assert_same(fwd_gpu, fwd_cpu)
    same_relation(
        maps.build_relation(gpu_table, fwd_gpu, geometry, False, "forward"),
        _ext.build_relation(cpu_table, fwd_cpu, *geometry, False, "forward"),
    )
    # Target: explicit coordinates (a copy, some outside the batch range).
    target = voxel_cloud(rng, 200, batches=4)
    same_relation(
        maps.build_relation(gpu_table, target, geometry, False, "target"),
        _ext.build_relation(cpu_table, target, *geometry, False, "target"),
    )
    # Transposed onto the upsampled set, and generative with its support.
    up = coords * mx.array([1, *geometry[1]], dtype=mx.int32)
    same_relation(
        maps.build_relation(gpu_table, up, geometry, True, "transposed"),
        _ext.build_relation(cpu_table, up, *geometry, True, "transposed"),
    )
    gen_gpu = maps.generative_support(gpu_table, geometry)
    gen_cpu = _ext.generative_support(cpu_table, *geometry)
    assert_same(gen_gpu, gen_cpu)
    same_relation(
        maps.build_relation(gpu_table, gen_gpu, geometry, True, "generative"),
        _ext.build_relation(cpu_table, gen_cpu, *geometry, True, "generative"),
    )


def test_large_cloud_submanifold(rng):
    coords = voxel_cloud(rng, 60000, batches=2, extent=40)
    geometry = ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    same_relation(
        maps.build_relation(maps.CudaTable(coords), coords, geometry, False, "submanifold"),
        _ext.build_relation(_ext.CoordTable(coords), coords, *geometry, False, "submanifold"),
    )


def test_manager_builds_on_gpu(rng, on_gpu):
    from mlx_lattice.relation import KernelGeometry

    coords = voxel_cloud(rng, 500)
    gpu, cpu_m = CoordinateManager(), CoordinateManager()
    g_set = gpu.register(coords)
    assert g_set.backend.name == "cuda"
    mx.set_default_device(mx.cpu)
    c_set = cpu_m.register(mx.array(np.array(coords)))
    assert c_set.backend.name == "cpu"
    mx.set_default_device(mx.gpu)
    for geom in (KernelGeometry((3, 3, 3), padding=(1, 1, 1)), KernelGeometry((2, 2, 2), (2, 2, 2))):
        if geom.stride == (1, 1, 1):
            same_relation(gpu.submanifold_kernel_relation(g_set, geom),
                          cpu_m.submanifold_kernel_relation(c_set, geom))
            continue
        g_rel, g_out = gpu.kernel_relation(g_set, geom)
        c_rel, c_out = cpu_m.kernel_relation(c_set, geom)
        assert_same(g_out.coords, c_out.coords)
        same_relation(g_rel, c_rel)
        g_t, _ = gpu.transposed_kernel_relation(g_out, geom)
        c_t, _ = cpu_m.transposed_kernel_relation(c_out, geom)
        same_relation(g_t, c_t)
        g_g, g_gs = gpu.generative_relation(g_out, geom)
        c_g, c_gs = cpu_m.generative_relation(c_out, geom)
        assert_same(g_gs.coords, c_gs.coords)
        same_relation(g_g, c_g)


@pytest.mark.parametrize(
    "rows, message",
    [
        ([[0, 1, 2, 3], [1, 0, 0, 0], [0, 1, 2, 3]], "duplicate rows 0 and 2"),
        ([[0, 1, 2, 3], [0, 70000, 0, 0]], "leaves the supported range"),
        ([[-1, 0, 0, 0]], "leaves the supported range"),
    ],
)
def test_bad_coordinates_raise_cpu_message(rows, message):
    coords = mx.array(np.array(rows, dtype=np.int32))
    with pytest.raises(ValueError, match=message):
        maps.CudaTable(coords)


def test_large_cloud_supports(rng, dedup):
    coords = voxel_cloud(rng, 40000, batches=2, extent=40)
    table, cpu = maps.CudaTable(coords), _ext.CoordTable(coords)
    for geometry in (((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1)), ((3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1))):
        assert_same(maps.forward_support(table, geometry), _ext.forward_support(cpu, *geometry))
        assert_same(maps.generative_support(table, geometry), _ext.generative_support(cpu, *geometry))


def test_support_out_of_range_raises(dedup):
    coords = mx.array(np.array([[0, 65535, 0, 0]], dtype=np.int32))
    geometry = ((3, 3, 3), (1, 1, 1), (0, 0, 0), (1, 1, 1))
    with pytest.raises(ValueError, match="leaves the supported range"):
        maps.generative_support(maps.CudaTable(coords), geometry)


def test_relation_sizes_and_synchronisations(rng):
    """build() reads the largest output and input rows in the one
    synchronisation of its size; a support costs one more, a trusted table
    (an output support) none."""
    coords = voxel_cloud(rng, 800, batches=2)
    mx.eval(coords)
    cpu_table = _ext.CoordTable(coords)
    for geometry in GEOMETRIES:
        table = maps.CudaTable(coords)
        maps.READS.clear()
        out = maps.forward_support(table, geometry)
        out_table = maps.CudaTable(out, trusted=True)
        native, max_out, max_in, _ = maps.build(table, out, geometry, False, "forward")
        assert dict(maps.READS) == {"support size": 1, "relation size": 1}
        assert out_table.size == out.shape[0]
        c = _ext.build_relation(cpu_table, _ext.forward_support(cpu_table, *geometry), *geometry, False, "forward")
        assert max_out == c.max_neighbors
        assert max_in == c.swapped("transposed").max_neighbors
        # onto its own support: a kernel that tiles the grid has one edge per
        # input row, so nothing is read (its largest output row stays unread)
        maps.READS.clear()
        native, max_out, max_in, _ = maps.build(table, out, geometry, False, "forward", onto_support=True)
        tiles = geometry[0] == geometry[1] and geometry[3] == (1, 1, 1)
        assert dict(maps.READS) == ({} if tiles else {"relation size": 1})
        assert (max_out, max_in) == ((None, 1) if tiles else (c.max_neighbors, c.swapped("transposed").max_neighbors))
        same_relation(native, c)
        for kind, out in (("submanifold", coords), ("target", voxel_cloud(rng, 300, batches=3))):
            maps.READS.clear()
            native, max_out, max_in, _ = maps.build(table, out, geometry, False, kind)
            assert dict(maps.READS) == {"relation size": 1}
            c = _ext.build_relation(cpu_table, out, *geometry, False, kind)
            assert (max_out, max_in) == (c.max_neighbors, c.swapped("transposed").max_neighbors)


def test_manager_synchronisations(rng, on_gpu):
    """A set given by the user: one synchronisation (its error flags); a
    strided map: one for its support's size, and none for its relation where
    the kernel tiles the grid (k2s2: an edge per input row), its output set
    none; a submanifold map: one; a transposed map onto the encoder set, the
    swapped relation and every plan of a layer: none."""
    from mlx_lattice.backends import cuda as cuda_routes
    from mlx_lattice.relation import KernelGeometry

    m = CoordinateManager()
    maps.READS.clear()
    s = m.register(voxel_cloud(rng, 600, extent=10))
    assert dict(maps.READS) == {"table flags": 1}
    down = KernelGeometry((2, 2, 2), (2, 2, 2))
    rel, out = m.kernel_relation(s, down)
    sub = m.submanifold_kernel_relation(out, KernelGeometry((3, 3, 3), padding=(1, 1, 1)))
    up, _ = m.transposed_kernel_relation(out, down)
    for r in (rel, sub, up):
        view = cuda_routes.view_of(r)
        mx.eval(vars(view.plan()), vars(view.flipped().plan()), view.wgrad_chunks()[:2])
    assert dict(maps.READS) == {"table flags": 1, "support size": 1, "relation size": 1}
    assert rel.edges == s.size  # one edge per input row, known without a read
