"""Routes metal.knn and metal.radius (metal/neighbors.metal) against an
independent NumPy brute force and the CPU queries.

On a Mac each step of a query (grid, count, fill) is an array of the
MetalNeighborStep primitive, whose eval_gpu encodes
_ext.metal_neighbor_program(route, step, params) into the outputs of
_ext.metal_neighbor_outputs(route, step, params, edges). Here the same
steps, with the same arguments, run through the CPU harness in place of the
path's _run (`Steps`; on a Mac with Metal the primitives themselves run), so
mlx_lattice.neighbors.knn / radius run with the Metal backend executing:
the registry's selection and route record, the path's host logic
(mlx_lattice/backends/metal/neighbors.py: the parameters, sizes, the one
read-back, empty sets, the edge-count overflow) and every program it
encodes, step by step, with the grid's invariants checked after its step.

With integral coordinates (voxels) squared distances are exact 64-bit
integers, so offsets and indices must equal the brute force (float64)
element for element, ties and the inclusive radius boundary included, and
distances agree to float32 rounding. Float16 and bfloat16 inputs on a
lattice of eighths have exact float32 squared distances, so their ties are
exact too, in the float mode. Random float coordinates (no near-ties) give
the brute force's neighbours and order; exact duplicates still tie by index.
"""

from __future__ import annotations


import mlx.core as mx
import numpy as np
import pytest

import mlx_lattice as ml
from mlx_lattice import _ext, backends, mac_plan, routes
from mlx_lattice import neighbors as nb
from mlx_lattice.backends.metal import neighbors as metal_nbr

import metal_harness
import metal_programs

pytestmark = metal_programs.MARKS

SCHEDULES = ("forward", "reverse", "random")
NP_DTYPES = {"int32": np.int32, "float32": np.float32}


def garbage(shape, dtype: str) -> np.ndarray:
    """A fresh buffer as Metal leaves it: uninitialised (NaN / -7)."""
    return np.full(shape, np.nan if dtype == "float32" else -7, NP_DTYPES[dtype])


class Steps:
    """metal_nbr._run through the harness (on a Mac with Metal: the
    primitives on the GPU); records each step and checks the grid."""

    def __init__(self, schedule="random", seed=0):
        self.schedule, self.seed, self.steps = schedule, seed, []
        self._gpu = metal_nbr._run

    def __call__(self, route, step, inputs, params, edges=0):
        prog = _ext.metal_neighbor_program(route, step, params)
        outs = _ext.metal_neighbor_outputs(route, step, params, edges)
        if metal_programs.BACKEND == "metal":
            result = self._gpu(route, step, inputs, params, edges)
            for st in prog["steps"]:
                metal_harness.record_ran(st["kernel"], "metal")
        else:
            bufs = []
            for a in inputs:
                a = np.ascontiguousarray(np.array(a)).reshape(-1)
                assert a.size, "the path never binds an empty buffer"
                bufs.append(a)
            self.seed += 1
            fresh = [garbage(shape, dtype) for shape, dtype in outs]
            got = metal_programs.run_steps(prog, bufs, fresh, [], self.schedule, self.seed)
            result = [mx.array(g.reshape(shape)) for g, (shape, _) in zip(got, outs, strict=True)]
        assert [tuple(r.shape) for r in result] == [tuple(s) for s, _ in outs]
        self.steps.append(step)
        if step == "grid":
            grid, n, c = np.array(result[0]), params.n_points, params.n_cells
            assert grid[0] == 0 and grid[c + 1] == n
            assert sorted(grid[c + 2 :].tolist()) == list(range(n)), "the grid holds every point once"
            assert (np.diff(grid[1 : c + 2]) >= 0).all(), "cell starts ascend"
        return result


@pytest.fixture
def metal(monkeypatch):
    """Queries on the Metal backend (as on a Mac whose GPU is the default
    device), their steps run by `Steps`."""
    steps = Steps()
    monkeypatch.setattr(nb, "_backend", lambda: (backends.get("metal"), None))
    monkeypatch.setattr(metal_nbr, "_run", steps)
    return steps


# ---------------------------------------------------------------- the oracle
def brute(q, qb, p, pb, k=0, r=0.0):
    """Per query: [(squared distance float64, index)] sorted, own item only;
    k nearest when r == 0, else within r (at most k when k > 0)."""
    q = np.asarray(q, np.float64).reshape(-1, 3)
    p = np.asarray(p, np.float64).reshape(-1, 3)
    out = []
    for i in range(len(q)):
        same = np.nonzero(np.asarray(pb) == qb[i])[0]
        d = p[same] - q[i]
        d2 = (d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1]) + d[:, 2] * d[:, 2]
        hits = sorted(zip(d2.tolist(), same.tolist()))
        if r:
            hits = [h for h in hits if h[0] <= r * r]
        out.append(hits[:k] if k else hits)
    return out


def query(op, q, p, k=0, r=0.0, qb=None, pb=None):
    """nb.knn (r == 0) or nb.radius through the Metal route, checked to be
    the route taken: (offsets, indices, distances) as NumPy."""
    with ml.diagnostics.record() as log:
        if op == "knn":
            rel = nb.knn(q, p, k, query_batch=qb, point_batch=pb)
        else:
            rel = nb.radius(q, p, r, query_batch=qb, point_batch=pb, max_neighbors=k or None)
    (rec,) = log
    assert rec["route"] == f"metal.{op}" and rec["fallback"] is None, rec["route"]
    off, idx, dist = (np.array(a) for a in rel)
    assert off.dtype == np.int32 and idx.dtype == np.int32 and dist.dtype == np.float32
    return off, idx, dist


def check(q, qb, p, pb, k=0, r=0.0, exact=True, positions=None):
    """The Metal route's relation against the brute force (and the CPU's).
    `positions`: what the brute force sees of q and p when they are not
    float32 NumPy (float16 / bfloat16 arrays)."""
    op = "knn" if r == 0 else "radius"
    off, idx, dist = query(op, q, p, k, r, qb, pb)
    qn, pn = positions or (q, p)
    expected = brute(qn, qb, pn, pb, k, r)
    assert off[0] == 0 and len(off) == len(expected) + 1
    np.testing.assert_array_equal(np.diff(off), [len(h) for h in expected])
    for i, hits in enumerate(expected):
        assert idx[off[i] : off[i + 1]].tolist() == [j for _, j in hits], f"query {i}"
    want = np.sqrt([d for hits in expected for d, _ in hits]).astype(np.float32)
    np.testing.assert_allclose(dist, want, rtol=2e-7 if exact else 1e-6, atol=0)
    args = [mx.array(np.ascontiguousarray(a)) for a in (qn, qb, pn, pb)]
    args[0], args[2] = args[0].astype(mx.float32), args[2].astype(mx.float32)
    cpu = _ext.knn_query(*args, k) if r == 0 else _ext.radius_query(*args, float(r), k)
    np.testing.assert_array_equal(off, np.array(cpu[0]))
    np.testing.assert_array_equal(idx, np.array(cpu[1]))
    return off, idx, dist


def params_of(q, qb, p, pb, k=0, r=0.0):
    arrs = [mx.array(np.ascontiguousarray(a)) for a in (q, qb, p, pb)]
    return _ext.metal_neighbor_params(*arrs, k, r)


def voxels(rng, n, extent, batches):
    """Integral coordinates on a small lattice (many distance ties) with
    batch indices; duplicates allowed (point sets, not coordinate sets)."""
    return (rng.integers(-extent, extent, (n, 3)).astype(np.float32),
            np.sort(rng.integers(0, batches, n)).astype(np.int32))


# ---------------------------------------------------------------- k nearest
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("k", [1, 6, 40, 300])
def test_knn_voxels(metal, schedule, k):
    """Lattice points: ties everywhere; item 3 holds no points; k = 40 and
    300 exceed an item's points (every point, by distance then index)."""
    metal.schedule = schedule
    rng = np.random.default_rng(k)
    p, pb = voxels(rng, 150, 5, 3)
    q, qb = voxels(rng, 70, 6, 4)
    assert params_of(q, qb, p, pb, k).exact
    off, _, _ = check(q, qb, p, pb, k=k)
    np.testing.assert_array_equal(np.diff(off), np.minimum(k, np.bincount(pb, minlength=4)[qb]))
    assert metal.steps == ["grid", "count", "fill"]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_float_points(metal, schedule):
    """Random float coordinates (no near-ties), exact duplicates tying by
    index: knn, radius and a capped radius."""
    metal.schedule = schedule
    rng = np.random.default_rng(7)
    p = (rng.standard_normal((120, 3)) * 2.5).astype(np.float32)
    p[60:70] = p[:10]
    pb = rng.integers(0, 2, 120).astype(np.int32)
    pb[60:70] = pb[:10]
    q = np.concatenate([p[:20], (rng.standard_normal((30, 3)) * 3).astype(np.float32)])
    qb = rng.integers(0, 2, 50).astype(np.int32)
    qb[:20] = pb[:20]
    assert not params_of(q, qb, p, pb, 8).exact
    check(q, qb, p, pb, k=8, exact=False)
    check(q, qb, p, pb, r=1.1, exact=False)
    check(q, qb, p, pb, k=4, r=1.7, exact=False)


# ---------------------------------------------------------------- radius
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("r,cap", [(1.0, 0), (2 ** 0.5, 0), (3.0, 0), (2.0, 5)])
def test_radius_voxels_boundary(metal, schedule, r, cap):
    """Integral distances land exactly on the (inclusive) radius."""
    metal.schedule = schedule
    rng = np.random.default_rng(int(r * 10) + cap)
    p, pb = voxels(rng, 160, 4, 2)
    q, qb = voxels(rng, 60, 5, 3)
    _, _, dist = check(q, qb, p, pb, k=cap, r=r)
    assert np.isclose(dist.astype(np.float64), r, rtol=1e-6).any(), "the case must put points on the radius"


def test_radius_without_cap_many_neighbours(metal):
    """Every point of a dense item within the radius: the heap holds a
    query's whole neighbourhood, sorted in place."""
    rng = np.random.default_rng(11)
    p, pb = voxels(rng, 400, 3, 1)
    q, qb = voxels(rng, 20, 3, 1)
    off, _, _ = check(q, qb, p, pb, r=4.0)
    assert np.diff(off).max() > 200


# ---------------------------------------------------------------- inputs
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_position_dtypes_with_exact_float_ties(metal, dtype):
    """float32 / float16 / bfloat16 positions on a lattice of eighths, off
    the integers (the float mode): every squared distance is exact in
    float32, so ties break by index exactly as in the brute force."""
    rng = np.random.default_rng(12)
    pn = (rng.integers(-40, 40, (130, 3)) / 8 + 1 / 8).astype(np.float32)
    qn = (rng.integers(-44, 44, (50, 3)) / 8 + 1 / 8).astype(np.float32)
    pb, qb = rng.integers(0, 2, 130).astype(np.int32), rng.integers(0, 3, 50).astype(np.int32)
    cast = getattr(mx, dtype)
    p, q = mx.array(pn).astype(cast), mx.array(qn).astype(cast)
    assert np.array_equal(np.array(p.astype(mx.float32)), pn), "exact in the dtype"
    assert not params_of(qn, qb, pn, pb, 5).exact
    for k, r in ((5, 0.0), (0, 1.25), (3, 1.5)):
        check(q, qb, p, pb, k=k, r=r, positions=(qn, pn))


def test_voxel_tensors_and_coordinates(metal):
    """(N, 4) integer coordinates and SparseTensors: batch from column 0."""
    rng = np.random.default_rng(4)
    c = np.unique(np.concatenate([rng.integers(0, 2, (80, 1)), rng.integers(-4, 4, (80, 3))], 1), axis=0)
    c = c.astype(np.int32)
    x = ml.SparseTensor(mx.array(c), mx.zeros((len(c), 1)))
    pos, b = c[:, 1:].astype(np.float32), c[:, 0].copy()
    off, idx, _ = query("radius", x, x, r=1.5)
    expected = brute(pos, b, pos, b, r=1.5)
    assert [idx[off[i]:off[i + 1]].tolist() for i in range(len(c))] == [[j for _, j in h] for h in expected]
    off, idx, _ = query("knn", c, x, k=4)
    expected = brute(pos, b, pos, b, k=4)
    assert [idx[off[i]:off[i + 1]].tolist() for i in range(len(c))] == [[j for _, j in h] for h in expected]


def test_empty_sets(metal):
    """No queries, no points, or neither: no kernel runs."""
    rng = np.random.default_rng(5)
    p, pb = voxels(rng, 9, 2, 2)
    none = np.zeros((0, 3), np.float32), np.zeros(0, np.int32)
    for k, r in ((3, 0.0), (0, 1.5), (2, 1.5)):
        op = "knn" if r == 0 else "radius"
        off, idx, dist = query(op, none[0], p, k, r, none[1], pb)
        assert off.tolist() == [0] and len(idx) == len(dist) == 0
        off, idx, dist = query(op, p, none[0], k, r, pb, none[1])
        assert off.tolist() == [0] * 10 and len(idx) == len(dist) == 0
        off, idx, _ = query(op, none[0], none[0], k, r, none[1], none[1])
        assert off.tolist() == [0] and len(idx) == 0
    assert metal.steps == []


def test_no_edges_skips_the_fill(metal):
    """Queries whose items hold no points, or nothing within the radius:
    the count reads zero edges back and the fill never runs."""
    p = np.array([[0, 0, 0], [5, 5, 5]], np.float32)
    q = np.array([[0.5, 0.5, 0.5], [9, 9, 9]], np.float32)
    off, idx, _ = query("radius", q, p, r=0.1)
    assert off.tolist() == [0, 0, 0] and len(idx) == 0
    off, idx, _ = query("knn", q, p, k=2, qb=np.array([1, 1], np.int32), pb=np.zeros(2, np.int32))
    assert off.tolist() == [0, 0, 0] and len(idx) == 0
    assert metal.steps == ["grid", "count"] * 2


def test_sparse_batch_indices(metal):
    """Large, sparse batch indices (more items than points), queries of
    items without points and past the grid's items."""
    rng = np.random.default_rng(6)
    p, _ = voxels(rng, 20, 3, 1)
    pb = np.array([0] * 5 + [700] * 10 + [2500] * 5, np.int32)
    q, _ = voxels(rng, 12, 3, 1)
    qb = np.array([0, 700, 2500, 3, 9999, 700] * 2, np.int32)
    check(q, qb, p, pb, k=4)
    check(q, qb, p, pb, r=2.0)
    # unsorted batches
    perm = rng.permutation(20)
    check(q, qb, p[perm], pb[perm], k=3)


@pytest.mark.parametrize("n_query", [1, 255, 256, 257])
def test_threadgroup_edges(metal, n_query):
    """Query counts around the 256-thread threadgroups (one query thread
    past the last group's end, or none)."""
    rng = np.random.default_rng(n_query)
    p, pb = voxels(rng, 300, 6, 2)
    q, qb = voxels(rng, n_query, 6, 2)
    check(q, qb, p, pb, k=3)


def test_many_cells_and_queries_scan(metal):
    """More cells and queries than the scan's threads hold in one pass."""
    rng = np.random.default_rng(9)
    p, pb = voxels(rng, 1500, 12, 2)
    q, qb = voxels(rng, 1200, 12, 2)
    assert params_of(q, qb, p, pb, 2).n_cells > 1024
    check(q, qb, p, pb, k=2)


def test_degenerate_sets(metal):
    """All points on a line, one point, one query, far outliers."""
    p = np.stack([np.arange(30), np.zeros(30), np.zeros(30)], 1).astype(np.float32)
    pb = np.zeros(30, np.int32)
    q = np.array([[3, 1, 0], [-4, 0, 0], [40, 2, 2]], np.float32)
    qb = np.zeros(3, np.int32)
    check(q, qb, p, pb, k=4)
    check(q, qb, p, pb, r=2.5)
    check(q, qb, p[:1], pb[:1], k=2)
    check(q, qb, p[:1], pb[:1], r=100.0)
    check(q[:1], qb[:1], p[:1], pb[:1], k=1)
    rng = np.random.default_rng(3)
    far, fb = voxels(rng, 100, 3, 2)
    far += np.float32(5000)
    far[:3] = [[-9000, 0, 0], [0, 20000, 7], [1, 1, -30000]]
    fq = np.concatenate([far[:40] + 1, [[0, 0, 0], [90000, -90000, 0]]]).astype(np.float32)
    fqb = np.concatenate([fb[:40], [0, 1]]).astype(np.int32)
    check(fq, fqb, far, fb, k=7)
    check(fq, fqb, far, fb, k=3, r=2.0)


def test_float_points_far_from_origin(metal):
    """A small radius at large coordinates: the cell widens so indices
    stay within float precision of the origin."""
    rng = np.random.default_rng(8)
    p = (rng.uniform(0, 1, (80, 3)) * 3 + 1e4).astype(np.float32)
    p[0] = [-1e4, 0, 0]
    pb = np.zeros(80, np.int32)
    check(p[:30], pb[:30], p, pb, r=0.5, exact=False)
    check(p[:30], pb[:30], p, pb, k=5, exact=False)


def test_float_agreement_rule_near_ties(metal):
    """Candidates within float32 rounding of each other: the relation holds
    neighbours whose float64 distances equal the CPU's to float32 rounding
    (the documented agreement rule)."""
    base = np.array([0.1, 0.2, 0.3], np.float32)
    eps = np.float32(1e-7)
    p = np.stack([base + [1, 0, 0], base + [0, 1 + eps, 0], base + [0, 0, 1 - eps], base + [0, 0, -1]])
    p = p.astype(np.float32)
    q = base[None]
    off, idx, dist = query("knn", q, p, k=3)
    c_off, _, c_dist = (np.array(a) for a in _ext.knn_query(
        mx.array(q), mx.zeros((1,), mx.int32), mx.array(p), mx.zeros((4,), mx.int32), 3))
    np.testing.assert_array_equal(off, c_off)
    d64 = np.sqrt(((p[idx].astype(np.float64) - q.astype(np.float64)) ** 2).sum(1))
    np.testing.assert_allclose(np.sort(d64), np.sort(c_dist.astype(np.float64)), rtol=1e-6)
    np.testing.assert_allclose(dist, c_dist, rtol=1e-6)


# ---------------------------------------------------------------- the host path
def test_one_synchronisation_per_query(metal):
    rng = np.random.default_rng(13)
    p, pb = voxels(rng, 60, 3, 1)
    before = metal_nbr.SYNCS
    query("knn", p, p, k=3, qb=pb, pb=pb)
    query("radius", p, p, r=1.0, qb=pb, pb=pb)
    assert metal_nbr.SYNCS - before == 2
    assert metal.steps == ["grid", "count", "fill"] * 2


def test_edge_count_past_int32_is_refused(monkeypatch):
    """The GPU's scan adds in int32: a relation past 2^31 - 1 edges wraps,
    which the host sees as a negative offset and refuses with the CPU's
    message (the true count); the fill never runs."""
    counts = np.array([2**28] * 8 + [5], np.int64)  # 2^31 + 5 edges
    wrapped = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32).view(np.int32)
    ran = []

    def fake(route, step, inputs, params, edges=0):
        ran.append(step)
        if step == "grid":
            return [mx.zeros((params.n_cells + 2 + params.n_points,), mx.int32)]
        assert step == "count"
        return [mx.array(wrapped)]

    monkeypatch.setattr(metal_nbr, "_run", fake)
    q = np.zeros((9, 3), np.float32)
    with pytest.raises(ValueError, match=f"would hold {2**31 + 5} edges, more than int32 offsets address"):
        metal_nbr.knn(mx.array(q), mx.zeros((9,), mx.int32), mx.array(q), mx.zeros((9,), mx.int32), 3)
    assert ran == ["grid", "count"]


# ---------------------------------------------------------------- selection
def test_a_mac_selects_the_metal_routes():
    """Queries recorded on this machine's CPU, put to the registry as a Mac
    of each tier would see them: the Metal routes."""
    rng = np.random.default_rng(14)
    p = (rng.standard_normal((40, 3))).astype(np.float32)
    with ml.diagnostics.record() as log:
        nb.knn(p, p, 4)
        nb.radius(p, p, 0.5, max_neighbors=8)
        nb.radius(p, p, 0.5)
    assert [r["route"] for r in log] == ["cpu.knn", "cpu.radius", "cpu.radius"]
    for tier in mac_plan.TIERS:
        for rec in log:
            sel = routes.select(mac_plan.mac_context(rec, tier))
            assert sel.route.name == f"metal.{rec['op']}" and sel.fallback is None


def test_selection_per_device(monkeypatch, request):
    """metal.knn / metal.radius only when the default device is a GPU, MLX
    runs Metal and the build has the Metal kernels (never on this Linux
    build as it is); a Mac GPU without the kernels runs the CPU's, on record."""
    from mlx_lattice.backends import build

    request.addfinalizer(build.forget)
    steps = Steps()
    monkeypatch.setattr(metal_nbr, "_run", steps)
    p = np.array([[0, 0, 0], [1, 0, 0], [0, 2, 0], [3, 3, 3]], np.float32)
    if not mx.metal.is_available():
        with ml.diagnostics.record() as log:
            nb.knn(p, p, 2)
        assert log[0]["route"] in ("cpu.knn", "cuda.knn")
    for gpu_device, on_metal, built in metal_programs.device_situations(monkeypatch):
        with ml.diagnostics.record() as log:
            rel = nb.knn(p, p, 2)
            nb.radius(p, p, 1.0)
        on_gpu = gpu_device and on_metal
        expect = "metal" if on_gpu and built else "cpu"
        assert [r["route"] for r in log] == [f"{expect}.knn", f"{expect}.radius"]
        if on_gpu and not built:
            assert all(r["fallback"].startswith("mlx_lattice.metallib unavailable") for r in log)
        else:
            assert all(r["fallback"] is None for r in log)
        assert np.array(rel.indices).tolist() == [0, 1, 1, 0, 2, 0, 3, 2]
    assert steps.steps == ["grid", "count", "fill"] * 2


def test_step_primitive_needs_a_metal_stream():
    """The primitive exists on every build; evaluating it off a Metal GPU
    stream is an error, not a fallback."""
    p, pb = np.zeros((3, 3), np.float32), np.zeros(3, np.int32)
    params = params_of(p, pb, p, pb, 2)
    arrs = [mx.array(a) for a in (p, pb, p, pb)]
    (grid,) = _ext.metal_neighbor_step("metal.knn", "grid", arrs, params, stream=mx.default_stream(mx.cpu))
    assert grid.shape == (params.n_cells + 2 + 3,) and grid.dtype == mx.int32
    with pytest.raises(RuntimeError, match="Metal neighbour queries run on a Metal GPU stream"):
        mx.eval(grid)


def test_outside_the_predicates_runs_on_the_cpu_on_record(metal):
    """Batch indices past the grid's, coordinates past float32 squared
    distances, a radius below them: the CPU route runs, the route log says
    why, and no Metal step runs."""
    p = np.array([[0, 0, 0], [1, 0, 0], [0, 2, 0]], np.float32)
    cases = [
        (dict(k=2, pb=np.array([0, 0, 1 << 20], np.int32)), "knn",
         "requires point batch indices below 2^20, not met: batches=1048577"),
        (dict(k=2, p=p * np.float32(2.0**61)), "knn",
         "requires coordinates within 2^60 of the origin (float32 squared distances), not met: "
         f"coord_max={2.0**62!r}"),
        (dict(r=2.0**-61, p=p * np.float32(2.0**-60)), "radius",
         f"requires 2^-60 <= radius <= 2^60 (float32 squared radius), not met: radius={2.0**-61!r}"),
        (dict(r=2.0**61), "radius", "requires 2^-60 <= radius <= 2^60"),
    ]
    for kw, op, why in cases:
        pts, pb = kw.get("p", p), kw.get("pb", np.zeros(3, np.int32))
        with ml.diagnostics.record() as log:
            if op == "knn":
                rel = nb.knn(pts, pts, kw["k"], query_batch=pb, point_batch=pb)
            else:
                rel = nb.radius(pts, pts, kw["r"], query_batch=pb, point_batch=pb)
        (rec,) = log
        assert rec["route"] == f"cpu.{op}" and rec["backend"] == "cpu"
        assert rec["fallback"] == "no metal route accepts this call; running on the CPU"
        reasons = {x["route"]: x["reason"] for x in rec["rejected"]}
        assert reasons[f"metal.{op}"].startswith(why), reasons[f"metal.{op}"]
        assert f"ran on the CPU: {rec['fallback']}" in log.why()
        expected = brute(pts, pb, pts, pb, kw.get("k", 0), kw.get("r", 0.0))
        off, idx = np.array(rel.offsets), np.array(rel.indices)
        assert [idx[off[i]:off[i + 1]].tolist() for i in range(3)] == [[j for _, j in h] for h in expected]
    assert metal.steps == []


def test_program_and_step_errors():
    rng = np.random.default_rng(15)
    p, pb = voxels(rng, 10, 3, 1)
    knn, rad = params_of(p, pb, p, pb, 3), params_of(p, pb, p, pb, 0, 1.5)
    with pytest.raises(ValueError, match="route 'metal.knn' runs k-nearest queries; the parameters are a radius"):
        _ext.metal_neighbor_program("metal.knn", "count", rad)
    with pytest.raises(ValueError, match="route 'metal.radius' runs radius queries"):
        _ext.metal_neighbor_outputs("metal.radius", "grid", knn)
    with pytest.raises(ValueError, match="no Metal neighbour route named 'cpu.knn'"):
        _ext.metal_neighbor_program("cpu.knn", "grid", knn)
    with pytest.raises(ValueError, match="neighbour step must be 'grid', 'count' or 'fill', got 'sort'"):
        _ext.metal_neighbor_program("metal.knn", "sort", knn)
    with pytest.raises(ValueError, match=r"edges must lie in \[1, 2\^31 - 1\], got 0"):
        _ext.metal_neighbor_outputs("metal.knn", "fill", knn, 0)
    arrs = [mx.array(a) for a in (p, pb, p, pb)]
    with pytest.raises(ValueError, match="'count' takes 5 inputs, got 4"):
        _ext.metal_neighbor_step("metal.knn", "count", arrs, knn)
    with pytest.raises(ValueError, match="points does not match the query's parameters"):
        _ext.metal_neighbor_step("metal.knn", "grid", arrs[:2] + [arrs[2][:5], arrs[3]], knn)
    z3, z1 = mx.zeros((2, 3)), mx.zeros((2,), dtype=mx.int32)
    with pytest.raises(ValueError, match="k must be positive"):
        _ext.metal_neighbor_params(z3, z1, z3, z1, 0)
    with pytest.raises(ValueError, match="float32 array"):
        _ext.metal_neighbor_params(z3, z1, mx.zeros((2, 2)), z1, 3)
    with pytest.raises(ValueError, match="below 2"):
        _ext.metal_neighbor_params(z3, z1, z3, mx.array([0, 1 << 21], dtype=mx.int32), 3)
    with pytest.raises(ValueError, match="radius must be a positive finite float32"):
        _ext.metal_neighbor_params(z3, z1, z3, z1, 0, 1e300)
