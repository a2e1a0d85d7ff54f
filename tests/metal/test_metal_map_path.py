"""Route metal.hash_map: the run-time path of mlx_lattice/metal_maps.py.

On a Metal GPU each step is an array of the MetalMapStep primitive, whose
eval_gpu encodes _ext.metal_map_program(step, ...) into an output of
_ext.metal_map_shape(step, ...). Here the same steps, with the same
arguments, run through the CPU harness instead (`harness_step`), so the
path's host logic (sizes, the one read-back per map, empty sets, errors)
and every program it encodes are checked against the CPU builder on every
kind, stride, dilation, padding, batches and empty sets; through the
CoordinateManager too. The selection predicate is checked on its own.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlx_lattice as ml
from mlx_lattice import _ext, manager, metal_maps
from mlx_lattice.relation import KernelGeometry

import metal_programs
import oracle
from test_metal_maps import garbage, run_step, t3

pytestmark = metal_programs.MARKS
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


def relation_arrays(native):
    return [np.array(a) for a in (native.out_offsets, native.in_idx, native.k_idx, native.neighbor_map)]


def assert_same_relation(got, want, what):
    for name, g, w in zip(("out_offsets", "in_idx", "k_idx", "neighbor_map"), relation_arrays(got), relation_arrays(want)):
        np.testing.assert_array_equal(g, w, err_msg=f"{what}: {name}")
    for view in ("kernel_major", "input_major", "sorted_plan"):
        for g, w in zip(getattr(got, view)(), getattr(want, view)()):
            np.testing.assert_array_equal(np.array(g), np.array(w), err_msg=f"{what}: {view}")


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
    got = metal_maps.build_relation(table, out, spec, transposed, kind)
    want = _ext.build_relation(_ext.CoordTable(src), out, *spec, transposed, kind)
    assert_same_relation(got, want, kind)
    assert got.edges > 0 and got.kind == kind
    assert steps.steps[-3:] == ["count", "fill", "neighbor_map"]


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
    # inputs whose outputs reach nothing: a count with no fill
    far = mx.array(np.array([[0, 1000, 1000, 1000]], np.int32))
    steps.steps.clear()
    got = metal_maps.build_relation(full, far, spec, False, "target")
    assert got.edges == 0 and steps.steps == ["count"]
    np.testing.assert_array_equal(np.array(got.neighbor_map), -np.ones((1, 27), np.int32))


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
    relation and support equals a CPU manager's."""
    rng = np.random.default_rng(64)
    coords = mx.array(oracle.random_coords(rng, 200, 8, batches=2))
    cpu = ml.CoordinateManager()
    cs = cpu.register(coords)
    monkeypatch.setattr(metal_maps, "available", lambda: True)
    monkeypatch.setattr(manager, "_cuda_maps", lambda: False)  # a Mac has no CUDA
    assert manager.map_route() == "metal.hash_map"
    gpu = ml.CoordinateManager()
    gs = gpu.register(coords)
    assert gs.metal_table is not None and gs._table is None
    sub = KernelGeometry((3, 3, 3), padding=(1, 1, 1))
    down = KernelGeometry((2, 2, 2), stride=(2, 2, 2))
    gen = KernelGeometry((2, 2, 2), stride=(2, 2, 2))
    pairs = [
        (gpu.submanifold_kernel_relation(gs, sub), cpu.submanifold_kernel_relation(cs, sub)),
    ]
    (gf, gout), (cf, cout) = gpu.kernel_relation(gs, down), cpu.kernel_relation(cs, down)
    np.testing.assert_array_equal(np.array(gout.coords), np.array(cout.coords))
    assert gout.metal_table is not None
    pairs.append((gf, cf))
    pairs.append((gpu.transposed_kernel_relation(gout, sub)[0], cpu.transposed_kernel_relation(cout, sub)[0]))
    (gg, gout2), (cg, cout2) = gpu.generative_relation(gs, gen), cpu.generative_relation(cs, gen)
    np.testing.assert_array_equal(np.array(gout2.coords), np.array(cout2.coords))
    pairs.append((gg, cg))
    for g, c in pairs:
        assert_same_relation(g._native, c._native, g.kind)
    assert {"table", "count", "fill", "neighbor_map", "forward_support", "generative_support", "support_fill"} <= set(
        steps.steps
    )


def test_selection_predicate(monkeypatch):
    """metal.hash_map only when the default device is a GPU, MLX runs Metal
    and the build has the Metal kernels; never on this Linux build."""
    import mlx_lattice.metal_maps as mm

    if not mx.metal.is_available():
        assert not mm.available()
        assert manager.map_route() in ("cpu.hash_map", "cuda.hash_map")
        s = ml.CoordinateManager().register(mx.array(np.zeros((1, 4), np.int32)))
        assert s.metal_table is None
    for gpu_device in (False, True):
        for metal in (False, True):
            for built in (False, True):
                monkeypatch.setattr(mx, "default_device", lambda g=gpu_device: mx.Device(mx.gpu if g else mx.cpu))
                monkeypatch.setattr(mx.metal, "is_available", lambda m=metal: m)
                monkeypatch.setattr(_ext, "metal_available", lambda b=built: b)
                assert mm.available() == (gpu_device and metal and built)


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
