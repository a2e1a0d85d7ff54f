"""Route metal.hash_map: the run-time path of mlx_lattice/backends/metal/maps.py.

On a Metal GPU each step is an array of the MetalMapStep primitive, whose
eval_gpu encodes _ext.metal_map_program(step, ...) into an output of
_ext.metal_map_shape(step, ...). Here the same steps, with the same
arguments, run through the CPU harness instead (`HarnessSteps`), so the
path's host logic (sizes, the one read-back per map, empty sets, errors)
and every program it encodes are checked against the CPU builder on every
kind, stride, dilation, padding, batches and empty sets: the relation, the
views it hands to the native relation (out_idx, kernel-major, input-major,
input neighbour map, sorted plan) and the swapped relation of a transposed
convolution with its views; through the CoordinateManager and whole layers
too. The selection predicate is checked on its own.
"""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest

import mlx_lattice as ml
from mlx_lattice import _ext, backends, manager
from mlx_lattice.backends.metal import maps as metal_maps
from mlx_lattice.relation import KernelGeometry

import metal_programs
import oracle
from test_metal_maps import garbage, run_step, t3

pytestmark = metal_programs.MARKS


def use_metal_maps(monkeypatch, metal: bool = True) -> None:
    """Maps built by the Metal backend (as on a Mac whose GPU is the default
    device), or by the CPU backend."""
    backend = backends.get("metal") if metal else backends.CPU
    monkeypatch.setattr(manager, "map_backend", lambda: backend)
if metal_programs.BACKEND == "metal":
    pytestmark = pytestmark + [pytest.mark.skip(reason="map programs run through the CPU harness only")]

SCHEDULES = ("forward", "reverse", "random")


class HarnessSteps:
    """metal_maps._run through the harness; records the steps it ran."""

    def __init__(self, schedule="random", seed=0):
        self.schedule, self.seed, self.steps = schedule, seed, []

    def __call__(self, step, inputs, n_in, n_out, geometry, transposed, edges):
        prog = _ext.metal_map_program(step, n_in, n_out, *geometry, transposed, edges)
        shape = tuple(_ext.metal_map_shape(step, n_in, n_out, *geometry, transposed, edges))
        size = int(np.prod(shape))
        bufs = []
        for a in inputs:
            a = np.ascontiguousarray(np.array(a), np.int32).reshape(-1)
            bufs.append(a if a.size else garbage(0))
        self.seed += 1
        out = run_step(prog, bufs, garbage(size), self.schedule, self.seed)
        self.steps.append(step)
        return mx.array(out[:size].reshape(shape))


@pytest.fixture
def steps(monkeypatch):
    run = HarnessSteps()
    monkeypatch.setattr(metal_maps, "_run", run)
    return run


ARRAYS = ("out_offsets", "in_idx", "k_idx", "neighbor_map", "out_idx", "input_neighbor_map")
VIEW_STEPS = ["out_idx", "kernel_major", "input_major", "neighbor_map", "sorted_plan", "sorted_plan"]


def assert_same_relation(got, want, what):
    """Every array a layer reads, element for element, dtypes and shapes
    included."""
    assert (got.kind, got.n_in, got.n_out, got.kernel_volume, got.edges) == (
        want.kind, want.n_in, want.n_out, want.kernel_volume, want.edges), what
    for name in ARRAYS:
        g, w = getattr(got, name), getattr(want, name)
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what}: {name}"
        np.testing.assert_array_equal(np.array(g), np.array(w), err_msg=f"{what}: {name}")
    for view in ("kernel_major", "input_major", "sorted_plan"):
        if view == "sorted_plan" and want.kernel_volume > 64:
            continue
        for g, w in zip(getattr(got, view)(), getattr(want, view)(), strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape, f"{what}: {view}"
            np.testing.assert_array_equal(np.array(g), np.array(w), err_msg=f"{what}: {view}")
    for view in (_ext.View.output_major, _ext.View.input_major):  # the matrix-unit routes' row orders
        g, w = got.row_order(view), want.row_order(view)
        assert g.dtype == w.dtype == mx.int32 and g.shape == w.shape, f"{what}: row order {view}"
        np.testing.assert_array_equal(np.array(g), np.array(w), err_msg=f"{what}: row order {view}")
    assert got.max_neighbors == want.max_neighbors, what


def cpu_support(coords, spec, generative):
    fn = _ext.generative_support if generative else _ext.forward_support
    return np.array(fn(_ext.CoordTable(mx.array(coords)), *spec)).reshape(-1, 4)


CASES = [
    # kind, kernel size, stride, padding, dilation
    ("submanifold", 3, 1, 1, 1),
    ("submanifold", (3, 1, 5), 1, (2, 0, 4), (2, 1, 2)),
    ("forward", 2, 2, 0, 1),
    ("forward", 3, (2, 1, 3), (0, 1, 2), (1, 2, 1)),
    ("generative", 2, 2, 0, 1),
    ("generative", 3, (1, 2, 1), 1, (2, 1, 1)),
    ("target", 3, 1, 1, 1),
    ("transposed", 3, 2, 1, 1),
    ("transposed", (2, 3, 1), (2, 3, 1), 0, 1),
]


@pytest.mark.parametrize("kind,ks,stride,pad,dil", CASES)
def test_path_every_kind(steps, kind, ks, stride, pad, dil):
    rng = np.random.default_rng(61)
    coords = oracle.random_coords(rng, 150, 7, batches=3)
    spec = (t3(ks), t3(stride), t3(pad), t3(dil))
    if kind == "transposed":  # the coarse set of a strided layer onto its fine set
        t = _ext.CoordTable(mx.array(coords))
        fine, coords = coords, np.array(_ext.forward_support(t, *spec))
    src = mx.array(coords)
    table = metal_maps.MetalTable(src)
    assert steps.steps == ["table"]
    if kind in ("forward", "generative"):
        out = (metal_maps.generative_support if kind == "generative" else metal_maps.forward_support)(table, spec)
        np.testing.assert_array_equal(np.array(out), cpu_support(coords, spec, kind == "generative"))
        np.testing.assert_array_equal(
            np.array(out),
            (oracle.generative_support if kind == "generative" else oracle.forward_support)(coords, *spec),
        )
    elif kind == "target":
        out = mx.array(oracle.random_coords(rng, 90, 9, batches=4))
    elif kind == "transposed":
        out = mx.array(fine)
    else:
        out = src
    transposed = kind in ("transposed", "generative")
    steps.steps.clear()
    syncs = metal_maps.SYNCS
    got = metal_maps.build_relation(table, out, spec, transposed, kind)
    assert metal_maps.SYNCS == syncs + 1  # the edge count; the views need none
    assert steps.steps == ["count", "fill", "neighbor_map"] + VIEW_STEPS
    want = _ext.build_relation(_ext.CoordTable(src), out, *spec, transposed, kind)
    assert_same_relation(got, want, kind)
    assert got.edges > 0 and got.kind == kind
    # the swapped relation (a transposed layer over a strided one's edges),
    # and swapped back
    steps.steps.clear()
    back = metal_maps.swapped(got, "transposed", spec)
    assert metal_maps.SYNCS == syncs + 2  # its row offsets
    # its CSR arrays and both neighbour maps are the views of `got`, reused
    assert steps.steps == ["out_idx", "kernel_major", "input_major", "sorted_plan"]
    assert_same_relation(back, want.swapped("transposed"), kind + " swapped")
    again = metal_maps.swapped(back, kind, spec)
    assert_same_relation(again, want, kind + " swapped twice")


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_path_schedules_and_batches(monkeypatch, schedule):
    """Many rows (several scan rows per thread, sorts past one block), a
    batch with no inputs, under every schedule."""
    monkeypatch.setattr(metal_maps, "_run", HarnessSteps(schedule, seed=3))
    rng = np.random.default_rng(62)
    coords = oracle.random_coords(rng, 1500, 16, batches=2)
    spec = ((3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1))
    table = metal_maps.MetalTable(mx.array(coords))
    out = metal_maps.forward_support(table, spec)
    np.testing.assert_array_equal(np.array(out), cpu_support(coords, spec, False))
    got = metal_maps.build_relation(table, out, spec, False, "forward")
    want = _ext.build_relation(_ext.CoordTable(mx.array(coords)), out, *spec, False, "forward")
    assert_same_relation(got, want, schedule)
    swapped = metal_maps.swapped(got, "transposed", spec)
    assert_same_relation(swapped, want.swapped("transposed"), schedule + " swapped")
    targets = mx.array(np.concatenate([coords[:50], [[3, 0, 0, 0]]]).astype(np.int32))  # batch 3: no inputs
    got = metal_maps.build_relation(table, targets, spec, False, "target")
    want = _ext.build_relation(_ext.CoordTable(mx.array(coords)), targets, *spec, False, "target")
    assert_same_relation(got, want, schedule + " target")


def test_path_empty(steps):
    spec = ((3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1))
    none = mx.zeros((0, 4), mx.int32)
    some = mx.array(oracle.random_coords(np.random.default_rng(63), 20, 4))
    empty = metal_maps.MetalTable(none)
    for fn in (metal_maps.forward_support, metal_maps.generative_support):
        assert fn(empty, spec).shape == (0, 4)
    full = metal_maps.MetalTable(some)
    for table, out in ((empty, none), (empty, some), (full, none)):
        got = metal_maps.build_relation(table, out, spec, False, "target")
        want = _ext.build_relation(_ext.CoordTable(table.coords), out, *spec, False, "target")
        assert_same_relation(got, want, "empty")
        assert got.edges == 0
    # inputs whose outputs reach nothing: a count with no fill, views
    # without launches but the sorted plan of the edgeless rows
    far = mx.array(np.array([[0, 1000, 1000, 1000], [0, -900, 0, 0]], np.int32))
    steps.steps.clear()
    got = metal_maps.build_relation(full, far, spec, False, "target")
    assert got.edges == 0 and steps.steps == ["count", "sorted_plan"]
    np.testing.assert_array_equal(np.array(got.neighbor_map), -np.ones((2, 27), np.int32))
    want = _ext.build_relation(_ext.CoordTable(full.coords), far, *spec, False, "target")
    assert_same_relation(got, want, "no edges")
    steps.steps.clear()
    assert_same_relation(metal_maps.swapped(got, "transposed", spec), want.swapped("transposed"), "no edges swapped")
    assert steps.steps == ["sorted_plan"]  # of its 20 edgeless rows; the rest without launches


def test_path_errors_are_the_cpu_builders(steps):
    dup = mx.array(np.array([[0, 1, 2, 3], [0, 4, 4, 4], [0, 1, 2, 3]], np.int32))
    with pytest.raises(ValueError) as metal_err:
        metal_maps.MetalTable(dup)
    with pytest.raises(ValueError) as cpu_err:
        _ext.CoordTable(dup)
    assert str(metal_err.value) == str(cpu_err.value)
    far = mx.array(np.array([[0, 0, 0, 0], [1, 40000, 0, 0]], np.int32))
    spec = ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    with pytest.raises(ValueError, match=r"\(1, 40000, 0, 0\) leaves the supported range"):
        metal_maps.generative_support(metal_maps.MetalTable(far), spec)
    with pytest.raises(ValueError, match=r"must be an \(N, 4\) int32 array"):
        metal_maps.MetalTable(mx.zeros((3, 3), mx.int32))
    with pytest.raises(ValueError, match="kernel sizes above 64"):
        metal_maps.build_relation(metal_maps.MetalTable(far), far, ((65, 1, 1),) + spec[1:], False, "target")


def test_manager_uses_the_metal_path(monkeypatch, steps):
    """With the predicate true, the manager hashes on the GPU path and every
    relation and support, with its views, equals a CPU manager's."""
    rng = np.random.default_rng(64)
    coords = mx.array(oracle.random_coords(rng, 200, 8, batches=2))
    sub = KernelGeometry((3, 3, 3), padding=(1, 1, 1))
    down = KernelGeometry((2, 2, 2), stride=(2, 2, 2))
    gen = KernelGeometry((2, 2, 2), stride=(2, 2, 2))

    def build(metal):
        use_metal_maps(monkeypatch, metal)
        assert manager.map_route() == ("metal.hash_map" if metal else "cpu.hash_map")
        m = ml.CoordinateManager()
        s = m.register(coords)
        assert (s.backend.name == "metal") == metal and (s._table is None) == metal
        rels, sets = [m.submanifold_kernel_relation(s, sub)], []
        rel, out = m.kernel_relation(s, down)
        assert (out.backend.name == "metal") == metal
        rels.append(rel)
        sets.append(out)
        rels.append(m.transposed_kernel_relation(out, sub)[0])
        # the same geometry as the strided layer: its edges swapped, no hashing
        steps.steps.clear()
        rel, dst = m.transposed_kernel_relation(out, down)
        assert dst is s and "count" not in steps.steps
        rels.append(rel)
        rel, out = m.generative_relation(s, gen)
        rels.append(rel)
        sets.append(out)
        return rels, sets

    cpu_rels, cpu_sets = build(False)
    gpu_rels, gpu_sets = build(True)
    for g, c in zip(gpu_sets, cpu_sets, strict=True):
        np.testing.assert_array_equal(np.array(g.coords), np.array(c.coords))
    for g, c in zip(gpu_rels, cpu_rels, strict=True):
        assert g.backend == "metal" and c.backend == "cpu"
        assert_same_relation(g._native, c._native, g.kind)
        for view in ("input_major", "kernel_major", "sorted_plan"):  # through the Python views too
            a, b = dataclasses.asdict(getattr(g, view)()), dataclasses.asdict(getattr(c, view)())
            assert a.keys() == b.keys()
            for key in a:
                np.testing.assert_array_equal(np.array(a[key]), np.array(b[key]), err_msg=f"{g.kind}: {view}.{key}")
        np.testing.assert_array_equal(np.array(g.out_idx), np.array(c.out_idx))
        assert g.stats() == c.stats()


def test_selection_predicate(monkeypatch, request):
    """metal.hash_map only when the default device is a GPU, MLX runs Metal
    and the build has the Metal kernels; never on this Linux build."""
    from mlx_lattice.backends import build

    request.addfinalizer(build.forget)
    if not mx.metal.is_available():
        assert manager.map_route() in ("cpu.hash_map", "cuda.hash_map")
        s = ml.CoordinateManager().register(mx.array(np.zeros((1, 4), np.int32)))
        assert s.backend.name != "metal"
    for gpu_device, on_metal, built in metal_programs.device_situations(monkeypatch):
        expect = "metal.hash_map" if gpu_device and on_metal and built else "cpu.hash_map"
        assert manager.map_route() == expect


def test_step_primitive_needs_a_metal_stream():
    """The primitive exists on every build; evaluating it off a Metal GPU
    stream is an error, not a fallback."""
    coords = mx.array(np.zeros((2, 4), np.int32))
    spec = ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    a = _ext.metal_map_step("table", [coords], 2, 0, *spec, False, 0, stream=mx.default_stream(mx.cpu))
    assert a.shape == (_ext.metal_map_shape("table", 2, 0, *spec, False)[0],) and a.dtype == mx.int32
    with pytest.raises(RuntimeError, match="Metal map building runs on a Metal GPU stream"):
        mx.eval(a)
    with pytest.raises(ValueError, match="input 0 must be int32"):
        _ext.metal_map_step("table", [coords.astype(mx.float32)], 2, 0, *spec, False, 0, stream=mx.default_stream(mx.cpu))
    with pytest.raises(ValueError, match="map step must be"):
        _ext.metal_map_shape("sort", 2, 2, *spec, False)


def test_shapes_match_the_programs():
    """The output shape eval_gpu allocates covers what the programs write:
    the harness runs above use these shapes with guard pages."""
    spec = ((3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1))
    assert _ext.metal_map_shape("count", 10, 7, *spec, False) == [8]
    assert _ext.metal_map_shape("fill", 10, 7, *spec, False, 40) == [2, 40]
    assert _ext.metal_map_shape("neighbor_map", 10, 7, *spec, False, 40) == [7, 27]
    assert _ext.metal_map_shape("support_fill", 10, 0, *spec, False, 12) == [12, 4]
    assert _ext.metal_map_shape("forward_support", 10, 0, *spec, False) == [270 + 2 + 3 * 1024]
    assert _ext.metal_map_shape("sorted_plan", 0, 100, *spec, False) == [100 + 2 * 100 * 27 + 2 * 2]


def test_routes_read_the_attached_views(monkeypatch):
    """The Metal routes take their index arrays from the native relation
    (src/metal/routes.cpp, src/core/primitives.cpp): those must be the arrays of
    the map programs, not a CPU derivation. A harness whose view outputs
    are marked (+1000) shows which ones the primitives' inputs are."""
    marked = ("out_idx", "kernel_major", "sorted_plan")
    run = HarnessSteps()
    calls = {"neighbor_map": 0}

    def marking(step, inputs, n_in, n_out, geometry, transposed, edges):
        out = run(step, inputs, n_in, n_out, geometry, transposed, edges)
        if step == "neighbor_map":
            calls[step] += 1
            return out + 1000 if calls[step] == 2 else out  # the second: the input map
        if step == "input_major":  # only its perm: the input map is made from the rest
            a = np.array(out)
            a[n_in + 1 : n_in + 1 + edges] += 1000
            return mx.array(a)
        return out + 1000 if step in marked else out

    monkeypatch.setattr(metal_maps, "_run", marking)
    rng = np.random.default_rng(66)
    coords = mx.array(oracle.random_coords(rng, 120, 6))
    spec = ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    table = metal_maps.MetalTable(coords)
    rel = metal_maps.build_relation(table, coords, spec, False, "submanifold")
    cpu = _ext.build_relation(_ext.CoordTable(coords), coords, *spec, False, "submanifold")
    n = coords.shape[0]
    x, w = mx.zeros((n, 16), mx.float16), mx.zeros((27, 16, 16), mx.float16)

    def inputs(route, view):
        return [np.array(a) for a in _ext.conv_inputs(x, w, rel, view, route)[2:]]

    def plus(*arrays):  # a uint64 mask: 1000 added to both of its int32 words
        return [np.array(a) + (np.uint64(1000 + (1000 << 32)) if a.dtype == mx.uint64 else 1000) for a in arrays]

    im, km, plan = cpu.input_major(), cpu.kernel_major(), cpu.sorted_plan()
    got_im = rel.input_major()
    np.testing.assert_array_equal(np.array(got_im[1]), np.array(im[1]) + 1000)  # the attached view
    cases = [
        (inputs("metal.fetch_on_demand", _ext.View.input_major), [np.array(im[j]) for j in (0, 2, 3)]),
        (inputs("metal.fp32_atomic", _ext.View.output_major)[3:], plus(cpu.out_idx)),
        (inputs("metal.sorted_gemm", _ext.View.output_major)[3:], plus(plan[0], plan[1], plan[3])),
        (inputs("metal.dgrad_dense_channel", _ext.View.input_major)[3:4], plus(cpu.input_neighbor_map)),
        (inputs("metal.dense_channel", _ext.View.output_major)[4:], plus(plan[0])),
        (inputs("metal.csr_mma", _ext.View.output_major)[3:], plus(plan[0])),
        ([np.array(a) for a in _ext.weight_grad_inputs(x, mx.zeros((n, 16), mx.float16), rel,
                                                       _ext.View.output_major)[2:]],
         plus(km[0], km[2], km[3])),
    ]
    for got, want in cases:
        assert len(got) == len(want)
        for g, v in zip(got, want):
            np.testing.assert_array_equal(g, v.reshape(g.shape))
    # the input-major row order: the sorted-plan program's rows (marked)
    (order,) = inputs("metal.csr_mma", _ext.View.input_major)[3:]
    np.testing.assert_array_equal(np.sort(order), np.arange(n) + 1000)
    np.testing.assert_array_equal(inputs("metal.dgrad_dense_channel", _ext.View.input_major)[4], order)


def test_views_past_the_sorted_plan():
    """K > 64: no sorted plan (the CPU's raises the same message); the other
    views still come from the programs."""
    run = HarnessSteps()
    rng = np.random.default_rng(67)
    coords = mx.array(oracle.random_coords(rng, 60, 5))
    spec = ((5, 5, 5), (1, 1, 1), (2, 2, 2), (1, 1, 1))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metal_maps, "_run", run)
        got = metal_maps.build_relation(metal_maps.MetalTable(coords), coords, spec, False, "submanifold")
    assert run.steps[-4:] == ["out_idx", "kernel_major", "input_major", "neighbor_map"]
    want = _ext.build_relation(_ext.CoordTable(coords), coords, *spec, False, "submanifold")
    assert_same_relation(got, want, "K = 125")
    with pytest.raises(ValueError, match="sorted plan needs a kernel volume of at most 64"):
        got.sorted_plan()
    with pytest.raises(ValueError, match="sorted plan needs a kernel volume of at most 64"):
        metal_maps.Plans(got, spec).sorted_plan()


def test_attached_views_are_checked():
    """A view handed to a relation must have its sizes: a clear error, not a
    kernel reading past an array."""
    coords = mx.array(oracle.random_coords(np.random.default_rng(68), 30, 4))
    rel = _ext.build_relation(_ext.CoordTable(coords), coords, (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), False,
                              "submanifold")
    e, n, z = rel.edges, rel.n_out, mx.zeros
    with pytest.raises(ValueError, match=r"out_idx must be a \(%d\) int32 array" % e):
        rel.set_out_idx(z((e + 1,), mx.int32))
    with pytest.raises(ValueError, match="out_idx must be"):
        rel.set_out_idx(z((e,), mx.float32))
    with pytest.raises(ValueError, match=r"kernel_major offsets must be a \(28\) int32"):
        rel.set_kernel_major(z((27,), mx.int32), *(z((e,), mx.int32),) * 3)
    with pytest.raises(ValueError, match="input_major edges must be"):
        rel.set_input_major(z((n + 1,), mx.int32), *(z((e - 1,), mx.int32),) * 3)
    with pytest.raises(ValueError, match=r"input_neighbor_map must be a \(%d, 27\) int32" % n):
        rel.set_input_neighbor_map(z((n, 26), mx.int32))
    with pytest.raises(ValueError, match=r"tile_masks must be a \(1\) uint64"):
        rel.set_sorted_plan(z((n,), mx.int32), z((n, 27), mx.int32), z((27, n), mx.int32), z((1,), mx.int32))
    with pytest.raises(ValueError, match="does not match the relation's kernel volume 27"):
        metal_maps.Plans(rel, ((3, 3, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1)))
    # a view already built is kept: setting it later changes nothing
    want = np.array(rel.out_idx)
    rel.set_out_idx(z((e,), mx.int32))
    np.testing.assert_array_equal(np.array(rel.out_idx), want)


def test_layers_on_metal_maps_match_cpu_maps(monkeypatch, steps):
    """A small encoder-decoder, forward and backward, on maps built by the
    Metal path (the harness) and on the CPU builder's: bitwise the same,
    since every array a layer reads is the same."""
    from mlx_lattice import ops

    rng = np.random.default_rng(69)
    coords = mx.array(oracle.random_coords(rng, 300, 9, batches=2))
    feats = mx.array(rng.standard_normal((coords.shape[0], 8)).astype(np.float32))
    w = [mx.array(rng.standard_normal(s).astype(np.float32) * 0.3) for s in
         ((8, 3, 3, 3, 8), (16, 2, 2, 2, 8), (16, 3, 3, 3, 16), (8, 2, 2, 2, 16), (4, 2, 2, 2, 8))]

    def net(f, *ws):
        x = ml.SparseTensor(coords, f, manager=mgr)
        y = ops.subm_conv3d(x, ws[0])
        d = ops.conv3d(y, ws[1], stride=2)
        d = ops.subm_conv3d(d, ws[2])
        u = ops.conv_transpose3d(d, ws[3], stride=2)  # the strided layer's edges swapped
        g = ops.generative_conv_transpose3d(u, ws[4], stride=2)
        return (u.feats * u.feats).sum() + g.feats.sum()

    results = []
    for metal in (False, True):
        use_metal_maps(monkeypatch, metal)
        mgr = ml.CoordinateManager()
        steps.steps.clear()
        loss, grads = mx.value_and_grad(net, argnums=tuple(range(6)))(feats, *w)
        mx.eval(loss, grads)
        assert ("count" in steps.steps) == metal
        results.append([np.array(loss)] + [np.array(g) for g in grads])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("spec,symmetric", [
    (((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1)), True),
    (((3, 1, 5), (1, 1, 1), (2, 0, 2), (2, 1, 1)), True),
    (((2, 2, 2), (1, 1, 1), (0, 0, 0), (1, 1, 1)), False),
    (((3, 3, 3), (1, 1, 1), (0, 0, 0), (1, 1, 1)), False),
])
def test_metal_builder_marks_symmetric_relations(steps, spec, symmetric):
    """The Metal builder marks a relation of a set onto its own
    rows as the CPU builder does (``_ext.symmetric_geometry``), and not one
    onto a copy of the rows; its edges are the CPU's."""
    rng = np.random.default_rng(70)
    coords = mx.array(oracle.random_coords(rng, 150, 6))
    metal = backends.get("metal")
    table = metal.table(coords)
    native = metal.relation(table, coords, spec, False, "target")[0]
    cpu = _ext.build_relation(_ext.CoordTable(coords), coords, *spec, False, "target")
    assert native.symmetric == cpu.symmetric == symmetric
    copy = metal.relation(table, mx.array(np.array(coords)), spec, False, "target")[0]
    assert not copy.symmetric
    for name in ("out_offsets", "in_idx", "k_idx"):
        np.testing.assert_array_equal(np.array(getattr(native, name)), np.array(getattr(cpu, name)))


def test_map_records(monkeypatch, steps):
    """Each map the Metal path builds is on record with its route, sizes and
    host synchronisations: one per table, support and relation (none for
    the views), one per swapped relation, none for an empty set."""
    from mlx_lattice import diagnostics

    use_metal_maps(monkeypatch)
    rng = np.random.default_rng(70)
    coords = mx.array(oracle.random_coords(rng, 150, 7, batches=2))
    down = KernelGeometry((2, 2, 2), stride=(2, 2, 2))
    sub = KernelGeometry((3, 3, 3), padding=(1, 1, 1))
    with diagnostics.record(maps=True) as log:
        m = ml.CoordinateManager()
        s = m.register(coords)
        m.submanifold_kernel_relation(s, sub)
        rel, out = m.kernel_relation(s, down)
        back, _ = m.transposed_kernel_relation(out, down)
        m.register(mx.zeros((0, 4), mx.int32))
    got = [(r["product"], r["map_kind"], r["swapped"], r["syncs"]) for r in log]
    assert got == [
        ("table", None, False, 1), ("relation", "submanifold", False, 1),
        ("support", "forward", False, 1), ("table", None, False, 1), ("relation", "forward", False, 1),
        ("relation", "transposed", True, 1), ("table", None, False, 0),
    ]
    assert all(r["route"] == "metal.hash_map" and r["backend"] == "metal" for r in log)
    fwd, tr = log[4], log[5]
    assert (fwd["n_in"], fwd["n_out"], fwd["k"], fwd["edges"]) == (s.size, out.size, 8, rel.edges)
    assert (tr["n_in"], tr["n_out"], tr["edges"]) == (out.size, s.size, back.edges) and back.backend == "metal"


def test_path_with_unevaluated_steps(monkeypatch):
    """As on a GPU, each step's array is unevaluated when the path gets it
    (here: the harness output behind a pending add), through the manager's
    relations, a swapped relation and their statistics. (The harness reads
    a step's inputs when the step is made, so this cannot show that the
    swapped relation's own evaluation of its offsets is needed.)"""
    run = HarnessSteps()
    monkeypatch.setattr(metal_maps, "_run", lambda *a: run(*a) + 0)
    use_metal_maps(monkeypatch)
    rng = np.random.default_rng(71)
    coords = mx.array(oracle.random_coords(rng, 200, 8, batches=2))
    down = KernelGeometry((3, 3, 3), stride=(2, 2, 2), padding=(1, 1, 1))
    m, c = ml.CoordinateManager(), ml.CoordinateManager()
    gs = m.register(coords)
    rel, out = m.kernel_relation(gs, down)
    back, _ = m.transposed_kernel_relation(out, down)
    use_metal_maps(monkeypatch, False)
    cs = c.register(coords)
    crel, cout = c.kernel_relation(cs, down)
    cback, _ = c.transposed_kernel_relation(cout, down)
    for g, w in ((rel, crel), (back, cback)):
        assert g.backend == "metal" and g.stats() == w.stats()
        assert_same_relation(g._native, w._native, g.kind)
