"""metal/neighbors.metal against the CPU queries and brute force.

The three programs of one query (src/metal/neighbors.cpp, read through
_ext.metal_neighbor_program: grid, count, fill) run step by step through
the CPU harness, with the edge count read back between count and fill as
the host does. With integral coordinates (voxels) the GPU's squared
distances are exact 64-bit integers, so offsets and indices must equal the
CPU's (_ext.knn_query / radius_query, float64 distances) and a brute-force
float64 oracle element for element, radius boundary included; distances
agree to float32 rounding. With float coordinates distances are float32:
neighbours agree wherever no two candidates (nor a candidate and the
radius) are within float32 rounding of each other, and exact duplicates
still tie by index.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_lattice import _ext

import metal_programs

pytestmark = metal_programs.MARKS
if metal_programs.BACKEND == "metal":
    pytestmark = pytestmark + [pytest.mark.skip(reason="neighbour programs run through the CPU harness only")]

SCHEDULES = ("forward", "reverse", "random")


def garbage(n: int) -> np.ndarray:
    """A fresh buffer: Metal leaves new buffers uninitialised."""
    return np.full(max(n, 1), -7, np.int32)


def nonempty(a: np.ndarray) -> np.ndarray:
    """Metal buffers are never empty: a one-element stand-in for none."""
    return a if len(a) else np.zeros((1,) + a.shape[1:], a.dtype)


def run_step(program: dict, inputs: list, out: np.ndarray, schedule: str, seed: int) -> np.ndarray:
    """Every step of `program`; returns the (int32) output buffer."""
    assert not program["temps"]
    return metal_programs.run_steps(program, inputs, out, [], schedule, seed)


def params(program: dict) -> np.ndarray:
    """NeighborParams of a program's first step, as int32 words."""
    return np.frombuffer(program["steps"][0]["buffers"][-1][1], np.int32)


def metal_query(q, qb, p, pb, k=0, r=0.0, schedule="forward", seed=0):
    """(offsets, indices, distances, exact flag) of the Metal programs:
    k nearest when r == 0, else radius r keeping at most k (0: all)."""
    q, p = np.ascontiguousarray(q, np.float32).reshape(-1, 3), np.ascontiguousarray(p, np.float32).reshape(-1, 3)
    qb, pb = np.ascontiguousarray(qb, np.int32), np.ascontiguousarray(pb, np.int32)
    mq = [mx.array(q), mx.array(qb), mx.array(p), mx.array(pb)]
    kind = "knn" if r == 0 else "radius"
    prog = lambda step, e=0: _ext.metal_neighbor_program(step, *mq, k, r, e)
    grid_prog = prog("grid")
    words = params(grid_prog)
    n_cells, exact = int(words[6]), int(words[7])
    ins = [nonempty(q), nonempty(qb), nonempty(p), nonempty(pb), None, None]
    grid = run_step(grid_prog, ins, garbage(n_cells + 2 + len(p)), schedule, seed)
    assert grid[0] == 0 and grid[n_cells + 1] == len(p)
    order = grid[n_cells + 2 : n_cells + 2 + len(p)]
    assert sorted(order.tolist()) == list(range(len(p))), "the grid holds every point once"
    ins[4] = grid
    offsets = run_step(prog(f"{kind}_count"), ins, garbage(len(q) + 1), schedule, seed)[: len(q) + 1]
    e = int(offsets[len(q)])  # the host's one read-back
    ins[5] = offsets
    edges = run_step(prog(f"{kind}_fill", e), ins, garbage(2 * e), schedule, seed)
    return offsets, edges[:e], edges[e : 2 * e].view(np.float32), exact


def brute(q, qb, p, pb, k=0, r=0.0):
    """Per query: [(squared distance float64, index)] sorted, own item only."""
    q, p = np.asarray(q, np.float64).reshape(-1, 3), np.asarray(p, np.float64).reshape(-1, 3)
    out = []
    for i in range(len(q)):
        same = np.nonzero(np.asarray(pb) == qb[i])[0]
        d = p[same] - q[i]
        d2 = (d * d).sum(axis=1)
        hits = sorted(zip(d2.tolist(), same.tolist()))
        if r:
            hits = [h for h in hits if h[0] <= r * r]
        out.append(hits[:k] if k else hits)
    return out


def cpu_query(q, qb, p, pb, k=0, r=0.0):
    args = [mx.array(np.ascontiguousarray(a)) for a in (q, qb, p, pb)]
    args[0], args[2] = args[0].astype(mx.float32), args[2].astype(mx.float32)
    out = _ext.knn_query(*args, k) if r == 0 else _ext.radius_query(*args, float(r), k)
    return tuple(np.array(a) for a in out)


def check(q, qb, p, pb, k=0, r=0.0, schedule="forward", seed=0, exact=True):
    off, idx, dist, is_exact = metal_query(q, qb, p, pb, k, r, schedule, seed)
    assert is_exact == int(exact)
    c_off, c_idx, c_dist = cpu_query(q, qb, p, pb, k, r)
    np.testing.assert_array_equal(off, c_off)
    np.testing.assert_array_equal(idx, c_idx)
    np.testing.assert_allclose(dist, c_dist, rtol=2e-7 if exact else 1e-6, atol=0)
    expected = brute(q, qb, p, pb, k, r)
    for i, hits in enumerate(expected):
        assert idx[off[i] : off[i + 1]].tolist() == [j for _, j in hits], f"query {i}"
    return off, idx, dist


def voxels(rng, n, extent, batches):
    """Integral coordinates on a small lattice (many distance ties) with
    batch indices; duplicates allowed (point sets, not coordinate sets)."""
    return (rng.integers(-extent, extent, (n, 3)).astype(np.float32),
            np.sort(rng.integers(0, batches, n)).astype(np.int32))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("k", [1, 6, 40])
def test_knn_voxels(schedule, k):
    rng = np.random.default_rng(k)
    p, pb = voxels(rng, 150, 5, 3)
    q, qb = voxels(rng, 70, 6, 4)  # item 3 has no points
    off, _, _ = check(q, qb, p, pb, k=k, schedule=schedule, seed=k)
    counts = np.bincount(pb, minlength=4)
    np.testing.assert_array_equal(np.diff(off), np.minimum(k, counts[qb]))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("r,cap", [(1.0, 0), (2 ** 0.5, 0), (3.0, 0), (2.0, 5)])
def test_radius_voxels_boundary(schedule, r, cap):
    """Integral distances land exactly on the (inclusive) radius."""
    rng = np.random.default_rng(int(r * 10) + cap)
    p, pb = voxels(rng, 160, 4, 2)
    q, qb = voxels(rng, 60, 5, 3)
    off, idx, dist = check(q, qb, p, pb, k=cap, r=r, schedule=schedule, seed=cap)
    on = np.isclose(dist.astype(np.float64), r, rtol=1e-6)
    assert on.any(), "the case must put points on the radius"


def test_knn_far_voxels():
    """Points far from the origin and a few far outliers (sparse grid)."""
    rng = np.random.default_rng(3)
    p, pb = voxels(rng, 100, 3, 2)
    p += np.float32(5000)
    p[:3] = [[-9000, 0, 0], [0, 20000, 7], [1, 1, -30000]]
    q = np.concatenate([p[:40] + 1, [[0, 0, 0], [90000, -90000, 0]]]).astype(np.float32)
    qb = np.concatenate([pb[:40], [0, 1]]).astype(np.int32)
    check(q, qb, p, pb, k=7, schedule="random", seed=4)
    check(q, qb, p, pb, k=3, r=2.0, schedule="reverse")


def test_k_above_points_and_empty_sets():
    rng = np.random.default_rng(5)
    p, pb = voxels(rng, 9, 2, 2)
    q, qb = voxels(rng, 12, 2, 3)
    off, _, _ = check(q, qb, p, pb, k=50)
    assert off[-1] == sum(np.bincount(pb, minlength=3)[qb])
    none_p = np.zeros((0, 3), np.float32), np.zeros(0, np.int32)
    none_q = np.zeros((0, 3), np.float32), np.zeros(0, np.int32)
    for k, r in ((3, 0.0), (0, 1.5), (2, 1.5)):
        off, idx, _ = check(*none_q, p, pb, k=k, r=r)
        assert off.tolist() == [0] and len(idx) == 0
        off, idx, _ = check(q, qb, *none_p, k=k, r=r)
        assert off.tolist() == [0] * (len(q) + 1) and len(idx) == 0
        off, idx, _ = check(*none_q, *none_p, k=k, r=r)
        assert off.tolist() == [0]


def test_sparse_batch_indices():
    """Large, sparse batch indices: more items than points."""
    rng = np.random.default_rng(6)
    p, _ = voxels(rng, 20, 3, 1)
    pb = np.array([0] * 5 + [700] * 10 + [2500] * 5, np.int32)
    q, _ = voxels(rng, 12, 3, 1)
    qb = np.array([0, 700, 2500, 3, 9999, 700] * 2, np.int32)
    check(q, qb, p, pb, k=4, schedule="random", seed=2)
    check(q, qb, p, pb, r=2.0)


def test_flat_and_single_point_sets():
    """Degenerate extents: all points on a line, or one point."""
    p = np.stack([np.arange(30), np.zeros(30), np.zeros(30)], 1).astype(np.float32)
    pb = np.zeros(30, np.int32)
    q = np.array([[3, 1, 0], [-4, 0, 0], [40, 2, 2]], np.float32)
    qb = np.zeros(3, np.int32)
    check(q, qb, p, pb, k=4, schedule="random")
    check(q, qb, p, pb, r=2.5)
    check(q, qb, p[:1], pb[:1], k=2)
    check(q, qb, p[:1], pb[:1], r=100.0)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_float_points(schedule):
    """Random float coordinates (no near-ties): the same neighbours and
    order as the CPU; duplicated points still tie by index."""
    rng = np.random.default_rng(7)
    p = (rng.standard_normal((120, 3)) * 2.5).astype(np.float32)
    p[60:70] = p[:10]  # exact duplicates
    pb = rng.integers(0, 2, 120).astype(np.int32)
    pb[60:70] = pb[:10]
    q = np.concatenate([p[:20], (rng.standard_normal((30, 3)) * 3).astype(np.float32)])
    qb = rng.integers(0, 2, 50).astype(np.int32)
    qb[:20] = pb[:20]
    check(q, qb, p, pb, k=8, schedule=schedule, seed=1, exact=False)
    check(q, qb, p, pb, r=1.1, schedule=schedule, seed=2, exact=False)
    check(q, qb, p, pb, k=4, r=1.7, schedule=schedule, seed=3, exact=False)


def test_float_points_far_from_origin():
    """A small radius at large coordinates: the cell widens so indices
    stay within float precision of the origin."""
    rng = np.random.default_rng(8)
    p = (rng.uniform(0, 1, (80, 3)) * 3 + 1e4).astype(np.float32)
    p[0] = [-1e4, 0, 0]
    pb = np.zeros(80, np.int32)
    check(p[:30], pb[:30], p, pb, r=0.5, exact=False)
    check(p[:30], pb[:30], p, pb, k=5, exact=False)


def test_float_agreement_rule_near_ties():
    """Candidates within float32 rounding of each other: the Metal list
    holds neighbours whose float64 distances equal the CPU's to float32
    rounding (the documented agreement rule), in (float32 distance, index)
    order."""
    base = np.array([0.1, 0.2, 0.3], np.float32)
    eps = np.float32(1e-7)
    p = np.stack([base + [1, 0, 0], base + [0, 1 + eps, 0], base + [0, 0, 1 - eps], base + [0, 0, -1]]).astype(np.float32)
    pb = np.zeros(4, np.int32)
    q, qb = base[None], np.zeros(1, np.int32)
    off, idx, dist, exact = metal_query(q, qb, p, pb, k=3)
    c_off, c_idx, c_dist = cpu_query(q, qb, p, pb, k=3)
    assert exact == 0
    np.testing.assert_array_equal(off, c_off)
    d64 = np.sqrt(((p[idx].astype(np.float64) - q.astype(np.float64)) ** 2).sum(1))
    np.testing.assert_allclose(np.sort(d64), np.sort(c_dist.astype(np.float64)), rtol=1e-6)
    np.testing.assert_allclose(dist, c_dist, rtol=1e-6)


def test_many_cells_and_queries_scan():
    """More cells and queries than the scan's threads hold in one pass."""
    rng = np.random.default_rng(9)
    p, pb = voxels(rng, 1500, 12, 2)
    q, qb = voxels(rng, 1200, 12, 2)
    check(q, qb, p, pb, k=2, schedule="random", seed=5)


def test_program_errors():
    z3, z1 = mx.zeros((2, 3)), mx.zeros((2,), dtype=mx.int32)
    with pytest.raises(ValueError, match="does not match"):
        _ext.metal_neighbor_program("knn_count", z3, z1, z3, z1, 3, 1.0)
    with pytest.raises(ValueError, match="neighbour step"):
        _ext.metal_neighbor_program("sort", z3, z1, z3, z1, 3)
    with pytest.raises(ValueError, match="k must be positive"):
        _ext.metal_neighbor_program("grid", z3, z1, z3, z1, 0)
    with pytest.raises(ValueError, match="float32 array"):
        _ext.metal_neighbor_program("grid", z3, z1, mx.zeros((2, 2)), z1, 3)
    with pytest.raises(ValueError, match="below 2"):
        _ext.metal_neighbor_program("grid", z3, z1, z3, mx.array([0, 1 << 21], dtype=mx.int32), 3)
