"""KNN / radius relations and neighbour reductions against brute force."""

from __future__ import annotations

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import neighbors as nb
from mlx_lattice import routes

from conftest import assert_same_across_threads


# ---------------------------------------------------------------- oracle
def brute_pairs(q, qb, p, pb):
    """Per query: list of (squared distance float64, index), same item only."""
    q = np.asarray(q, np.float32).astype(np.float64)
    p = np.asarray(p, np.float32).astype(np.float64)
    out = []
    for i in range(len(q)):
        same = np.nonzero(np.asarray(pb) == qb[i])[0]
        d = q[i] - p[same]
        d2 = (d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1]) + d[:, 2] * d[:, 2]
        out.append(sorted(zip(d2.tolist(), same.tolist())))
    return out


def brute_knn(q, qb, p, pb, k):
    return [pairs[:k] for pairs in brute_pairs(q, qb, p, pb)]


def brute_radius(q, qb, p, pb, r, cap=None):
    res = [[h for h in pairs if h[0] <= r * r] for pairs in brute_pairs(q, qb, p, pb)]
    return [h[:cap] if cap else h for h in res]


def check(rel, expected):
    off = np.array(rel.offsets)
    idx = np.array(rel.indices)
    dist = np.array(rel.distances)
    assert off.dtype == np.int32 and idx.dtype == np.int32 and dist.dtype == np.float32
    assert len(off) == len(expected) + 1 and off[0] == 0
    for i, exp in enumerate(expected):
        got = idx[off[i]:off[i + 1]].tolist()
        assert got == [j for _, j in exp], f"query {i}"
        np.testing.assert_array_equal(dist[off[i]:off[i + 1]], np.sqrt([d for d, _ in exp]).astype(np.float32))


def cloud(rng, n, batches=1, scale=1.0, grid=None):
    """Points (optionally on a coarse lattice, to force distance ties)."""
    if grid:
        p = rng.integers(0, grid, (n, 3)).astype(np.float32) * np.float32(scale)
    else:
        p = (rng.standard_normal((n, 3)) * scale).astype(np.float32)
    return p, rng.integers(0, batches, n).astype(np.int32)


# ------------------------------------------------------------------ knn
@pytest.mark.parametrize("k", [1, 4, 17])
@pytest.mark.parametrize("batches", [1, 3])
def test_knn_matches_brute_force(k, batches):
    rng = np.random.default_rng(k * 10 + batches)
    p, pb = cloud(rng, 300, batches)
    q, qb = cloud(rng, 120, batches)
    rel = nb.knn(q, p, k, query_batch=qb, point_batch=pb)
    check(rel, brute_knn(q, qb, p, pb, k))


def test_knn_ties_break_by_index():
    rng = np.random.default_rng(0)
    p, pb = cloud(rng, 400, 2, grid=4)  # many duplicate points and equal distances
    q, qb = cloud(rng, 60, 2, grid=4)
    rel = nb.knn(q, p, 9, query_batch=qb, point_batch=pb)
    check(rel, brute_knn(q, qb, p, pb, 9))


def test_knn_k_exceeds_points_and_missing_items():
    p = np.array([[0, 0, 0], [1, 0, 0], [5, 5, 5]], np.float32)
    pb = np.array([0, 0, 2], np.int32)
    q = np.array([[0.2, 0, 0], [9, 9, 9], [0, 0, 0]], np.float32)
    qb = np.array([0, 2, 1], np.int32)  # item 1 has no points
    rel = nb.knn(q, p, 5, query_batch=qb, point_batch=pb)
    check(rel, brute_knn(q, qb, p, pb, 5))
    assert np.array(rel.counts).tolist() == [2, 1, 0]


def test_knn_skewed_and_flat_sets():
    rng = np.random.default_rng(1)
    dense = rng.standard_normal((200, 3)).astype(np.float32) * 0.01
    far = rng.standard_normal((20, 3)).astype(np.float32) * 100
    p = np.concatenate([dense, far])
    p[:, 2] = 0  # planar
    q = np.concatenate([rng.standard_normal((30, 3)) * 0.01, rng.standard_normal((10, 3)) * 1000]).astype(np.float32)
    rel = nb.knn(q, p, 8)
    z = np.zeros(len(q), np.int32)
    check(rel, brute_knn(q, z, p, np.zeros(len(p), np.int32), 8))


def test_knn_empty_sets():
    e = np.zeros((0, 3), np.float32)
    p = np.ones((4, 3), np.float32)
    rel = nb.knn(e, p, 3)
    assert rel.num_queries == 0 and rel.num_edges == 0 and np.array(rel.offsets).tolist() == [0]
    rel = nb.knn(p, e, 3)
    assert np.array(rel.offsets).tolist() == [0] * 5 and rel.num_edges == 0


# --------------------------------------------------------------- radius
@pytest.mark.parametrize("r", [0.3, 1.0, 3.5])
def test_radius_matches_brute_force(r):
    rng = np.random.default_rng(int(r * 10))
    p, pb = cloud(rng, 300, 2)
    q, qb = cloud(rng, 100, 2)
    rel = nb.radius(q, p, r, query_batch=qb, point_batch=pb)
    check(rel, brute_radius(q, qb, p, pb, r))


def test_radius_boundary_inclusive_and_cap():
    rng = np.random.default_rng(3)
    p, pb = cloud(rng, 300, 2, grid=5)
    q, qb = cloud(rng, 50, 2, grid=5)
    rel = nb.radius(q, p, 1.0, query_batch=qb, point_batch=pb)  # lattice: exact distance-1 ties
    check(rel, brute_radius(q, qb, p, pb, 1.0))
    rel = nb.radius(q, p, 2.0, query_batch=qb, point_batch=pb, max_neighbors=5)
    check(rel, brute_radius(q, qb, p, pb, 2.0, cap=5))


def test_radius_empty():
    e = np.zeros((0, 3), np.float32)
    assert nb.radius(e, e, 1.0).num_queries == 0
    rel = nb.radius(np.ones((2, 3), np.float32), e, 1.0)
    assert np.array(rel.offsets).tolist() == [0, 0, 0]


def test_voxel_sets():
    """SparseTensors and (N, 4) coordinates: voxel indices in grid units, batch from column 0."""
    rng = np.random.default_rng(4)
    c = np.unique(np.concatenate([rng.integers(0, 2, (80, 1)), rng.integers(-4, 4, (80, 3))], 1), axis=0)
    x = ml.SparseTensor(mx.array(c.astype(np.int32)), mx.zeros((len(c), 1)))
    rel = nb.radius(x, x, 1.5)
    pos, b = c[:, 1:].astype(np.float32), c[:, 0].astype(np.int32)
    check(rel, brute_radius(pos, b, pos, b, 1.5))
    rel = nb.knn(c, x, 4)
    check(rel, brute_knn(pos, b, pos, b, 4))


def test_deterministic_across_threads():
    rng = np.random.default_rng(5)
    p, pb = cloud(rng, 3000, 2)
    q, qb = cloud(rng, 2000, 2)
    assert_same_across_threads(
        lambda: (
            *nb.knn(q, p, 6, query_batch=qb, point_batch=pb),
            *nb.radius(q, p, 0.4, query_batch=qb, point_batch=pb),
        ),
        (1, 2, 3),
    )


def test_bad_arguments():
    p = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match="k must be a positive int"):
        nb.knn(p, p, 0)
    with pytest.raises(ValueError, match="k must be a positive int"):
        nb.knn(p, p, 2.5)
    with pytest.raises(ValueError, match="r must be a positive finite"):
        nb.radius(p, p, -1.0)
    with pytest.raises(ValueError, match="r must be a positive finite"):
        nb.radius(p, p, float("inf"))
    with pytest.raises(ValueError, match="max_neighbors must be None or a positive int"):
        nb.radius(p, p, 1.0, max_neighbors=0)
    with pytest.raises(ValueError, match=r"queries must be an \(N, 3\) float or \(N, 4\) integer"):
        nb.knn(np.zeros((3, 2), np.float32), p, 1)
    with pytest.raises(ValueError, match=r"points_batch must have shape \(3,\)"):
        nb.knn(p, p, 1, point_batch=np.zeros(2, np.int32))
    with pytest.raises(TypeError, match="queries_batch must hold integers"):
        nb.knn(p, p, 1, query_batch=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="batch indices must be >= 0"):
        nb.knn(p, p, 1, query_batch=-np.ones(3, np.int32))
    with pytest.raises(ValueError, match="points must be finite"):
        nb.knn(p, np.full((3, 3), np.nan, np.float32), 1)
    with pytest.raises(ValueError, match="queries_batch must be None"):
        nb.knn(np.zeros((2, 4), np.int32), p, 1, query_batch=np.zeros(2, np.int32))


def test_k_and_cap_past_the_points():
    """k or max_neighbors past any int32: every point of the item (the
    query never asks for more than the points there are)."""
    rng = np.random.default_rng(10)
    p, pb = cloud(rng, 30, 2)
    q, qb = cloud(rng, 12, 3)
    check(nb.knn(q, p, 2**40, query_batch=qb, point_batch=pb), brute_knn(q, qb, p, pb, 30))
    check(nb.radius(q, p, 1.0, query_batch=qb, point_batch=pb, max_neighbors=2**40),
          brute_radius(q, qb, p, pb, 1.0))


# ------------------------------------------------------------- routes
def test_queries_take_routes_on_record():
    """Each query is a route of the registry, recorded like a convolution:
    its context holds the sizes, neighbours wanted, radius, items and
    coordinate range the GPU routes' predicates read."""
    p = np.array([[0, 0, 0], [1, 0, 0], [0, 3, 0], [-2, 0, 5]], np.float32)
    pb = np.array([0, 0, 1, 4], np.int32)
    with ml.diagnostics.record() as log:
        nb.knn(p[:3], p, 50, query_batch=pb[:3], point_batch=pb)
        nb.radius(p, p, 1.5, query_batch=pb, point_batch=pb, max_neighbors=3)
        nb.radius(p, p, 1.5)
    knn, capped, radius = log
    on = ml.backends.executing()[0].name  # the default device's backend (the suite may run on a GPU)
    assert (knn["route"], capped["route"], radius["route"]) == (f"{on}.knn", f"{on}.radius", f"{on}.radius")
    assert knn["op"] == knn["direction"] == "knn" and radius["op"] == radius["direction"] == "radius"
    assert (knn["n_out"], knn["n_in"], knn["k"], knn["radius"]) == (3, 4, 4, 0.0)  # k: at most the points
    assert (capped["k"], capped["radius"], radius["k"]) == (3, 1.5, 0)
    assert knn["batches"] == 5 and radius["batches"] == 1 and knn["coord_max"] == 5.0
    assert knn["fallback"] is None and knn["dtype"] == "float32"
    assert log.why().splitlines() == [
        f"knn (k=4, 3 queries, 4 points): {on}.knn",
        f"radius (k=3, r=1.5, 4 queries, 4 points): {on}.radius",
        f"radius (k=0, r=1.5, 4 queries, 4 points): {on}.radius",
    ]
    assert log.table().splitlines()[2].split() == ["knn", "-", f"{on}.knn", on, "float32", "4", "-", "3", "-"]


def _query_ctx(op, backend, **kw):
    fields = dict(direction=op, map_kind="neighbors", dtype="float32", kernel_size=None, n_in=1000,
                  n_out=500, k=8, radius=0.0 if op == "knn" else 0.5, batches=2, coord_max=100.0)
    fields.update(kw)
    return routes.RouteContext(op, backend=backend, **fields)


@pytest.mark.parametrize("op", ["knn", "radius"])
def test_gpu_routes_and_their_limits(op):
    """Within the grid's limits each GPU takes its own route; past them the
    CPU's runs, the reason naming the requirement and the call's value."""
    for gpu in ("metal", "cuda"):
        sel = routes.select(_query_ctx(op, gpu))
        assert sel.route.name == f"{gpu}.{op}" and sel.fallback is None
        assert routes.select(_query_ctx(op, gpu, k=2**30, n_out=2**30, n_in=2**28)).route.name == f"{gpu}.{op}"
        for kw, why in (
            (dict(batches=2**20 + 1), "point batch indices below 2^20, not met: batches=1048577"),
            (dict(n_in=2**28 + 1), "at most 2^30 queries and 2^28 points, not met: n_out=500, n_in=268435457"),
            (dict(n_out=2**30 + 1), "at most 2^30 queries and 2^28 points"),
        ):
            sel = routes.select(_query_ctx(op, gpu, **kw))
            assert sel.route.name == f"cpu.{op}"
            assert sel.fallback == f"no {gpu} route accepts this call; running on the CPU"
            assert {r["route"]: r["reason"] for r in sel.rejected}[f"{gpu}.{op}"].startswith("requires " + why)
    # Metal's float32 squared distances; CUDA's are float64
    far = _query_ctx(op, "metal", coord_max=2.0**61)
    assert routes.select(far).route.name == f"cpu.{op}"
    assert routes.select(far._replace(backend="cuda")).route.name == f"cuda.{op}"
    assert routes.select(_query_ctx(op, "metal", coord_max=2.0**60)).route.name == f"metal.{op}"
    # conv routes never serve a query, nor neighbour routes a convolution
    assert all(r.name.endswith(f".{op}") for r in routes._REGISTRY.values()
               if r.applies(_query_ctx(op, r.backend)))


def test_radius_limits_per_gpu():
    for r, metal, cuda in ((2.0**-60, "metal", "cuda"), (2.0**-61, "cpu", "cuda"), (2.0**60, "metal", "cuda"),
                           (2.0**61, "cpu", "cuda"), (1e39, "cpu", "cpu"), (1e-46, "cpu", "cpu")):
        assert routes.select(_query_ctx("radius", "metal", radius=r)).route.name == f"{metal}.radius", r
        assert routes.select(_query_ctx("radius", "cuda", radius=r)).route.name == f"{cuda}.radius", r


# ------------------------------------------------------------- reduction
def brute_reduce(feats, rel, weights, reduce):
    off, idx = np.array(rel.offsets), np.array(rel.indices)
    f = np.asarray(feats, np.float64)
    out = np.zeros((len(off) - 1, f.shape[1]))
    for i in range(len(off) - 1):
        e = np.arange(off[i], off[i + 1])
        if len(e) == 0:
            continue
        v = f[idx[e]]
        if weights is not None:
            w = np.asarray(weights, np.float64)[e]
            v = v * (w[:, None] if w.ndim == 1 else w)
        out[i] = {"sum": v.sum(0), "mean": v.mean(0), "max": v.max(0)}[reduce]
    return out


@pytest.mark.parametrize("reduce", nb.REDUCTIONS)
@pytest.mark.parametrize("wshape", [None, "edge", "channel"])
def test_reduce_values(reduce, wshape):
    rng = np.random.default_rng(6)
    p, pb = cloud(rng, 120, 2)
    q, qb = cloud(rng, 50, 3)  # item 2 has no points: empty rows
    rel = nb.radius(q, p, 1.2, query_batch=qb, point_batch=pb)
    f = rng.standard_normal((len(p), 5)).astype(np.float32)
    e = rel.num_edges
    w = {None: None, "edge": rng.standard_normal(e), "channel": rng.standard_normal((e, 5))}[wshape]
    w = None if w is None else w.astype(np.float32)
    got = nb.neighbor_reduce(mx.array(f), rel, None if w is None else mx.array(w), reduce)
    np.testing.assert_allclose(np.array(got), brute_reduce(f, rel, w, reduce), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_reduce_half(dtype):
    rng = np.random.default_rng(7)
    p, _ = cloud(rng, 60)
    rel = nb.knn(p, p, 5)
    f = rng.standard_normal((60, 3)).astype(np.float32)
    got = nb.neighbor_reduce(mx.array(f).astype(dtype), rel, reduce="mean")
    assert got.dtype == dtype
    ref = brute_reduce(np.array(mx.array(f).astype(dtype).astype(mx.float32)), rel, None, "mean")
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("reduce", nb.REDUCTIONS)
def test_reduce_gradients(reduce):
    rng = np.random.default_rng(8)
    p, _ = cloud(rng, 40)
    rel = nb.knn(p[:25], p, 4)
    f = rng.standard_normal((40, 3)).astype(np.float32)
    w = rng.standard_normal(rel.num_edges).astype(np.float32)
    g = rng.standard_normal((25, 3)).astype(np.float32)

    def loss(feats, weights):
        return (nb.neighbor_reduce(feats, rel, weights, reduce) * mx.array(g)).sum()

    df, dw = mx.grad(loss, argnums=(0, 1))(mx.array(f), mx.array(w))
    off, idx = np.array(rel.offsets), np.array(rel.indices)
    ef, ew = np.zeros_like(f, dtype=np.float64), np.zeros(len(w))
    for i in range(25):
        es = np.arange(off[i], off[i + 1])
        v = f[idx[es]] * w[es, None]
        for c in range(3):
            if reduce == "max":
                sel = [es[int(np.argmax(v[:, c]))]]  # first maximal edge
                scale = 1.0
            else:
                sel = es
                scale = 1.0 / len(es) if reduce == "mean" else 1.0
            for e in sel:
                ef[idx[e], c] += g[i, c] * w[e] * scale
                ew[e] += g[i, c] * f[idx[e], c] * scale
    np.testing.assert_allclose(np.array(df), ef, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(dw), ew, rtol=1e-5, atol=1e-5)


def test_reduce_empty_and_errors():
    e = np.zeros((0, 3), np.float32)
    rel = nb.knn(np.ones((2, 3), np.float32), e, 2)
    out = nb.neighbor_reduce(mx.zeros((0, 4)), rel, reduce="max")
    assert out.shape == (2, 4) and not np.array(out).any()
    rel = nb.knn(np.ones((2, 3), np.float32), np.ones((3, 3), np.float32), 2)
    with pytest.raises(ValueError, match="reduce must be one of"):
        nb.neighbor_reduce(mx.zeros((3, 2)), rel, reduce="min")
    with pytest.raises(ValueError, match="feats has 1 rows"):
        nb.neighbor_reduce(mx.zeros((1, 2)), rel)
    with pytest.raises(ValueError, match=r"weights must have shape \(4,\) or \(4, 2\)"):
        nb.neighbor_reduce(mx.zeros((3, 2)), rel, mx.zeros((3,)))
    with pytest.raises(TypeError, match="relation must be a NeighborRelation"):
        nb.neighbor_reduce(mx.zeros((3, 2)), (1, 2, 3))
    with pytest.raises(ValueError, match=r"feats must be an \(N, C\) float"):
        nb.neighbor_reduce(mx.zeros((3,)), rel)


@pytest.mark.parametrize("reduce", nb.REDUCTIONS)
def test_reduce_jvp_matches_vjp(reduce):
    """Forward mode agrees with reverse mode: <J t, g> == <t, J^T g>."""
    rng = np.random.default_rng(9)
    c = np.unique(rng.integers(0, 5, (60, 4)), axis=0).astype(np.int32)
    x = ml.SparseTensor(mx.array(c), mx.array(rng.standard_normal((len(c), 3)).astype(np.float32)))
    rel = nb.radius(x, x, 1.8)
    t = mx.array(rng.standard_normal(x.feats.shape).astype(np.float32))
    g = mx.array(rng.standard_normal((rel.num_queries, 3)).astype(np.float32))
    fn = lambda f: nb.neighbor_reduce(f, rel, reduce=reduce)  # noqa: E731
    (jt,) = mx.jvp(fn, [x.feats], [t])[1]
    (vg,) = mx.vjp(fn, [x.feats], [g])[1]
    np.testing.assert_allclose((jt * g).sum().item(), (t * vg).sum().item(), rtol=1e-4)
    np.testing.assert_array_equal(np.array(nb.neighbor_reduce(x, rel, reduce=reduce)), np.array(fn(x.feats)))
