"""Relations: edge order, views, neighbour map, statistics and caching."""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import _ext, ops
from mlx_lattice.relation import KernelGeometry

import oracle


def by_out(e):
    """Edges ordered by (output row, kernel offset), the CSR order."""
    return e[np.lexsort((e[:, 2], e[:, 0]))]


def edges_of(rel):
    return np.stack([np.array(rel.out_idx), np.array(rel.in_idx), np.array(rel.k_idx)], 1)


@pytest.fixture
def tensor(rng):
    coords = oracle.random_coords(rng, 120, 8, 2)
    return ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32)), coords


def test_relation_kinds_match_oracle(tensor):
    x, coords = tensor
    m, s = x.manager, x.coordinate_set
    g3 = KernelGeometry((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    rel = m.submanifold_kernel_relation(s, g3)
    assert rel.kind == "submanifold"
    np.testing.assert_array_equal(edges_of(rel), oracle.conv_edges(coords, coords, 3, 1, 1))
    g2 = KernelGeometry((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    rel, out = m.kernel_relation(s, g2)
    assert rel.kind == "forward"
    np.testing.assert_array_equal(edges_of(rel), oracle.conv_edges(coords, np.array(out.coords), 2, 2, 0))
    rel_t, back = m.transposed_kernel_relation(out, g2)
    assert rel_t.kind == "transposed" and back is s
    np.testing.assert_array_equal(edges_of(rel_t), by_out(oracle.transposed_edges(np.array(out.coords), coords, 2, 2, 0)))
    rel_g, gen = m.generative_relation(s, g2)
    assert rel_g.kind == "generative"
    np.testing.assert_array_equal(
        edges_of(rel_g), by_out(oracle.transposed_edges(coords, np.array(gen.coords), 2, 2, 0))
    )
    tgt = m.register(mx.array(coords[::3]))
    rel_tg = m.target_kernel_relation(s, tgt, g3)
    assert rel_tg.kind == "target"
    np.testing.assert_array_equal(edges_of(rel_tg), oracle.conv_edges(coords, coords[::3], 3, 1, 1))


def test_views_and_neighbor_map(tensor):
    x, coords = tensor
    rel = x.manager.submanifold_kernel_relation(x.coordinate_set, KernelGeometry((3, 3, 3), (1,) * 3, (1,) * 3, (1,) * 3))
    e = edges_of(rel)
    # CSR offsets delimit rows; edges sorted by (out, k)
    off = np.array(rel.out_offsets)
    assert off[0] == 0 and off[-1] == len(e) and np.all(np.diff(off) >= 0)
    assert np.all(np.diff(e[:, 0] * 27 + e[:, 2]) > 0)
    im = rel.input_major()
    perm = np.array(im.perm)
    assert sorted(perm.tolist()) == list(range(len(e)))
    pe = e[perm]
    assert np.all(np.diff(pe[:, 1] * 27 + pe[:, 2]) > 0)  # sorted by (in, k)
    np.testing.assert_array_equal(np.array(im.out_idx), pe[:, 0])
    np.testing.assert_array_equal(np.array(im.k_idx), pe[:, 2])
    ioff = np.array(im.offsets)
    np.testing.assert_array_equal(np.diff(ioff), np.bincount(e[:, 1], minlength=len(coords)))
    km = rel.kernel_major()
    kperm = np.array(km.perm)
    ke = e[kperm]
    assert np.all(np.diff(ke[:, 2] * len(coords) + ke[:, 0]) > 0)  # sorted by (k, out)
    np.testing.assert_array_equal(np.array(km.in_idx), ke[:, 1])
    np.testing.assert_array_equal(np.diff(np.array(km.offsets)), np.bincount(e[:, 2], minlength=27))
    nm = np.array(rel.neighbor_map)
    assert nm.shape == (len(coords), 27)
    expected = -np.ones_like(nm)
    expected[e[:, 0], e[:, 2]] = e[:, 1]
    np.testing.assert_array_equal(nm, expected)
    # submanifold: centre offset is always present
    assert np.all(nm[:, 13] == np.arange(len(coords)))
    s = rel.stats()
    assert s["edges"] == len(e) and s["n_out"] == len(coords) and s["k"] == 27
    assert s["max_neighbors"] == np.diff(off).max()
    assert abs(s["mean_neighbors"] - len(e) / len(coords)) < 1e-12
    assert "Relation(kind='submanifold'" in repr(rel)


@pytest.mark.usefixtures("on_cpu")  # the CPU builder's views; thread counts are the CPU's
def test_views_of_a_large_relation_across_thread_counts(rng):
    """Kernel-major and input-major views over enough edges for several
    blocks of the parallel counting sort: exactly NumPy's stable sorts of the
    CSR edges, for one thread and for several."""
    coords = oracle.random_coords(rng, 40_000, 40, 1)
    g3 = KernelGeometry((3, 3, 3), (1,) * 3, (1,) * 3, (1,) * 3)

    def views():
        x = ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32))
        rel = x.manager.submanifold_kernel_relation(x.coordinate_set, g3)
        km, im = rel.kernel_major(), rel.input_major()
        arrays = (km.offsets, km.perm, km.in_idx, km.out_idx, im.offsets, im.perm, im.out_idx, im.k_idx)
        return edges_of(rel), [np.array(a) for a in arrays]

    before = ml.num_threads()
    try:
        ml.set_num_threads(1)
        e, one = views()
        ml.set_num_threads(4)
        e4, four = views()
    finally:
        ml.set_num_threads(before)
    assert len(e) > 3 * (1 << 16)
    np.testing.assert_array_equal(e, e4)
    for a, b in zip(one, four):
        np.testing.assert_array_equal(a, b)
    k_off, k_perm, k_in, k_out, i_off, i_perm, i_out, i_k = one
    kperm = np.argsort(e[:, 2], kind="stable")
    np.testing.assert_array_equal(k_perm, kperm)
    np.testing.assert_array_equal(k_in, e[kperm, 1])
    np.testing.assert_array_equal(k_out, e[kperm, 0])
    np.testing.assert_array_equal(k_off, np.concatenate([[0], np.cumsum(np.bincount(e[:, 2], minlength=27))]))
    iperm = kperm[np.argsort(e[kperm, 1], kind="stable")]
    np.testing.assert_array_equal(i_perm, iperm)
    np.testing.assert_array_equal(i_out, e[iperm, 0])
    np.testing.assert_array_equal(i_k, e[iperm, 2])
    np.testing.assert_array_equal(i_off, np.concatenate([[0], np.cumsum(np.bincount(e[:, 1], minlength=len(coords)))]))


def test_manager_caches(tensor):
    x, coords = tensor
    m = x.manager
    g = KernelGeometry((3, 3, 3), (1,) * 3, (1,) * 3, (1,) * 3)
    r1 = m.submanifold_kernel_relation(x.coordinate_set, g)
    r2 = m.submanifold_kernel_relation(x.coordinate_set, g)
    assert r1 is r2
    g2 = KernelGeometry((2, 2, 2), (2,) * 3, (0,) * 3, (1,) * 3)
    (a, sa), (b, sb) = m.kernel_relation(x.coordinate_set, g2), m.kernel_relation(x.coordinate_set, g2)
    assert a is b and sa is sb
    # a tensor sharing the coords array shares the set
    y = x.replace(mx.zeros((len(coords), 4)))
    assert y.coordinate_set is x.coordinate_set
    z = ml.SparseTensor(x.coords, np.zeros((len(coords), 1), np.float32), manager=m)
    assert z.coordinate_set is x.coordinate_set
    assert m.stats()["hits"] >= 2


def test_transposed_reuses_encoder_edges(tensor, rng):
    x, coords = tensor
    w = mx.array(rng.standard_normal((2, 3, 3, 3, 1)).astype(np.float32))
    down = ops.conv3d(x, w, stride=2, padding=1)
    builds = x.manager.builds
    up = ops.conv_transpose3d(down, mx.array(rng.standard_normal((1, 3, 3, 3, 2)).astype(np.float32)), stride=2, padding=1)
    assert up.coords is x.coords
    # swapped from the cached forward relation: counted as one cheap build, no hashing of new sets
    assert x.manager.stats()["coordinate_sets"] == 2
    assert x.manager.builds == builds + 1


def test_sorted_plan(tensor):
    x, coords = tensor
    rel = x.manager.submanifold_kernel_relation(x.coordinate_set, KernelGeometry((3, 3, 3), (1,) * 3, (1,) * 3, (1,) * 3))
    plan = rel.sorted_plan()
    nm = np.array(rel.neighbor_map)
    order = np.array(plan.reorder_rows)
    assert sorted(order.tolist()) == list(range(len(coords)))
    masks = ((nm >= 0).astype(np.uint64) << np.arange(27, dtype=np.uint64)).sum(1)
    assert np.all(np.diff(masks[order].astype(np.int64)) >= 0)  # sorted by mask
    np.testing.assert_array_equal(np.array(plan.sorted_out_in_map), nm[order])
    np.testing.assert_array_equal(np.array(plan.sorted_kv_out_in_map), nm[order].T)
    tiles = np.array(plan.tile_masks)
    assert plan.tile == 64 and len(tiles) == -(-len(coords) // 64)
    for t in range(len(tiles)):
        assert tiles[t] == np.bitwise_or.reduce(masks[order][t * 64 : (t + 1) * 64])
    assert rel.sorted_plan().reorder_rows is not None  # cached view


def _offset_set_keys(offsets, k_idx, k):
    """Relation::row_order's key per CSR row: bit k, or k * 64 // K past 64 offsets."""
    rows = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    bits = k_idx.astype(np.uint64) if k <= 64 else (k_idx.astype(np.int64) * 64 // k).astype(np.uint64)
    keys = np.zeros(len(offsets) - 1, np.uint64)
    np.bitwise_or.at(keys, rows, np.uint64(1) << bits)
    return keys


@pytest.mark.parametrize("kind,ks,stride", [("submanifold", 3, 1), ("forward", 3, 2), ("forward", 2, 2),
                                            ("transposed", 2, 2), ("submanifold", 5, 1)])
def test_row_order_of_both_views(rng, kind, ks, stride):
    """Each view's rows stably sorted by the offsets their edges have (the
    matrix-unit CSR routes' tile order): the output-major order is the sorted
    plan's (K <= 64); K = 125 keys offset k as bit k * 64 // K."""
    coords = oracle.random_coords(rng, 400, 9, 2)
    x = ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32))
    m, s = x.manager, x.coordinate_set
    pad = (ks - 1) // 2 if stride == 1 else 0
    g = KernelGeometry((ks,) * 3, (stride,) * 3, (pad,) * 3, (1,) * 3)
    if kind == "submanifold":
        rel = m.submanifold_kernel_relation(s, g)
    elif kind == "forward":
        rel, _ = m.kernel_relation(s, g)
    else:
        _, coarse = m.kernel_relation(s, g)
        rel, _ = m.transposed_kernel_relation(coarse, g)
    native, k = rel._native, rel.kernel_volume
    im = native.input_major()
    for view, offsets, k_idx in [(_ext.View.output_major, native.out_offsets, native.k_idx),
                                 (_ext.View.input_major, im[0], im[3])]:
        order = np.array(native.row_order(view))
        keys = _offset_set_keys(np.array(offsets), np.array(k_idx), k)
        np.testing.assert_array_equal(order, np.argsort(keys, kind="stable"))
        assert native.row_order(view) is not None  # cached
    if k <= 64:
        np.testing.assert_array_equal(np.array(native.row_order(_ext.View.output_major)),
                                      np.array(rel.sorted_plan().reorder_rows))


def test_native_relation_from_unevaluated_arrays():
    """A GPU builder hands over lazy arrays: every host derivation evaluates
    them first and equals the relation made from evaluated arrays."""
    from mlx_lattice import _ext

    rng = np.random.default_rng(11)
    coords = mx.array(oracle.random_coords(rng, 300, 8, batches=2))
    ref = _ext.build_relation(_ext.CoordTable(coords), coords, (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), False, "submanifold")

    def lazy(a):
        return mx.array(np.array(a)) + 0  # an unevaluated graph node

    for read in ("neighbor_map", "kernel_major", "input_major", "input_neighbor_map", "sorted_plan", "max_neighbors"):
        rel = _ext.Relation("submanifold", ref.n_in, ref.n_out, ref.kernel_volume,
                            lazy(ref.out_offsets), lazy(ref.in_idx), lazy(ref.k_idx))
        got, want = getattr(rel, read), getattr(ref, read)
        got, want = (got(), want()) if callable(got) else (got, want)
        for g, w in zip(*(v if isinstance(v, (tuple, list)) else [v] for v in (got, want))):
            np.testing.assert_array_equal(np.array(g), np.array(w))


@pytest.mark.usefixtures("on_cpu")  # the CPU builder's mirrored input-major view
@pytest.mark.parametrize("size,dilation", [((3, 3, 3), (1, 1, 1)), ((5, 3, 1), (1, 2, 1)), ((7, 7, 7), (1, 1, 1))])
def test_input_major_of_symmetric_relations(rng, size, dilation):
    """Submanifold relations read their input-major view off the mirrored
    CSR: exactly NumPy's stable sort of the edges by input row, over
    several batch items, anisotropic and dilated kernels."""
    coords = oracle.random_coords(rng, 3000, 16, 3)
    pad = tuple(d * (s - 1) // 2 for s, d in zip(size, dilation))
    g = KernelGeometry(size, (1,) * 3, pad, dilation)
    x = ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32))
    rel = x.manager.submanifold_kernel_relation(x.coordinate_set, g)
    e = edges_of(rel)
    im = rel.input_major()
    iperm = np.argsort(e[:, 1] * rel.kernel_volume + e[:, 2], kind="stable")
    np.testing.assert_array_equal(np.array(im.perm), iperm)
    np.testing.assert_array_equal(np.array(im.out_idx), e[iperm, 0])
    np.testing.assert_array_equal(np.array(im.k_idx), e[iperm, 2])
    np.testing.assert_array_equal(
        np.array(im.offsets), np.concatenate([[0], np.cumsum(np.bincount(e[:, 1], minlength=len(coords)))])
    )


GEOMETRIES = [(k, s, p, d) for k in (1, 2, 3) for s in (1, 2) for p in (0, 1, 2) for d in (1, 2)]


@pytest.mark.parametrize("k,s,p,d", GEOMETRIES)
def test_symmetric_geometry_is_edge_pairing(rng, k, s, p, d):
    """``_ext.symmetric_geometry`` (the predicate every builder asks) holds
    where a relation of a dense set onto itself pairs its edges, (q <- p, k)
    with (p <- q, K - 1 - k), by brute force: exactly so for odd kernels
    (an even one pairs only with an even dilation, and has no centre offset
    for the half lookup: not taken); the CPU builder marks those relations
    (native and reported alike)."""
    coords = oracle.random_coords(rng, 400, 4, 2)
    e = oracle.conv_edges(coords, coords, k, s, p, d)
    kv = k**3
    pairs = {(o, i, kk) for o, i, kk in e.tolist()} == {(i, o, kv - 1 - kk) for o, i, kk in e.tolist()}
    geom = ((k,) * 3, (s,) * 3, (p,) * 3, (d,) * 3)
    sym = _ext.symmetric_geometry(*geom, False)
    assert len(e) and (sym == pairs if k % 2 else not sym)
    assert not _ext.symmetric_geometry(*geom, True)
    x = ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32))
    m, cset = x.manager, x.coordinate_set
    rel = m._build(cset, cset.coords, KernelGeometry(*geom), False, "target")
    assert rel.symmetric == rel._native.symmetric == sym  # on any backend
    # onto a copy of the rows: the same edges, not the table's own rows
    other = _ext.build_relation(cset.table, mx.array(coords), *geom, False, "target")
    assert not other.symmetric
    if s == 2:  # onto its own support: fewer rows, never a symmetric relation
        strided = _ext.build_relation(cset.table, _ext.forward_support(cset.table, *geom), *geom, False, "forward")
        with pytest.raises(ValueError, match="n_in == n_out"):
            strided.set_symmetric()


@pytest.mark.usefixtures("on_cpu")  # the CPU builder's tiled path
@pytest.mark.parametrize("stride", [(2, 2, 2), (3, 2, 1)])
def test_tiling_kernel_support_and_relation(rng, stride):
    """A kernel with size = stride (no padding or dilation) tiles the grid:
    its support and relation, built from each input's one parent, against a
    brute-force NumPy oracle, with negative coordinates and several batches."""
    coords = oracle.random_coords(rng, 4000, 24, 3)
    coords[:, 1:] -= 11
    s = np.array(stride)
    parents = np.concatenate([coords[:, :1], np.floor_divide(coords[:, 1:], s)], 1)
    want_out = np.unique(parents, axis=0)  # lexicographic (b, x, y, z): the key order
    x = ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32))
    g = KernelGeometry(stride, stride, (0, 0, 0), (1, 1, 1))
    rel, out = x.manager.kernel_relation(x.coordinate_set, g)
    np.testing.assert_array_equal(np.array(out.coords), want_out)
    row_of = {tuple(c): i for i, c in enumerate(coords.tolist())}
    want = []
    for q, c in enumerate(want_out.tolist()):
        for k, d in enumerate(np.ndindex(*stride)):
            p = row_of.get((c[0], *(c[1 + a] * stride[a] + d[a] for a in range(3))))
            if p is not None:
                want.append((q, p, k))
    np.testing.assert_array_equal(edges_of(rel), np.array(want))
    nm = np.array(rel.neighbor_map)
    expected = -np.ones((len(want_out), int(np.prod(stride))), np.int64)
    e = np.array(want)
    expected[e[:, 0], e[:, 2]] = e[:, 1]
    np.testing.assert_array_equal(nm, expected)


@pytest.mark.parametrize("n", [0, 1, 9, 700, 20_000])
def test_table_lookups_of_absent_and_present_rows(rng, n):
    """The coordinate table answers a mix of present rows and absent
    neighbours (its presence filter's clear bits and its false positives)
    exactly as a Python dict does."""
    coords = oracle.random_coords(rng, n, 30, 2) if n else np.zeros((0, 4), np.int32)
    coords = coords[:n]
    row_of = {tuple(c): i for i, c in enumerate(coords.tolist())}
    shifts = rng.integers(-1, 2, size=(3 * max(len(coords), 1), 3))
    base = coords[rng.integers(0, len(coords), len(shifts))] if len(coords) else np.zeros((len(shifts), 4), np.int32)
    queries = base.copy()
    queries[:, 1:] += shifts
    queries = np.concatenate([coords, queries, np.array([[0, -65536, 65535, 0], [4095, 5, 5, 5]], np.int32)]).astype(np.int32)
    want = np.array([row_of.get(tuple(q), -1) for q in queries.tolist()])
    got = np.array(ml._ext.CoordTable(mx.array(coords)).lookup(mx.array(queries)))
    np.testing.assert_array_equal(got, want)
    assert (want < 0).any() and (n == 0 or (want >= 0).any())


@pytest.mark.usefixtures("on_cpu")  # the CPU builder
def test_tiled_relation_with_and_without_the_output_table(rng):
    """A forward tiled relation built with the output set's own table, with
    a table of other rows (not used) and with none gives the same arrays,
    for one thread and for several."""
    from mlx_lattice import _ext

    coords = mx.array(oracle.random_coords(rng, 30_000, 48, 2))
    g = ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    t = _ext.CoordTable(coords)
    out = _ext.forward_support(t, *g)
    other = mx.array(np.array(out)[::-1].copy())
    arrays = lambda r: [np.array(a) for a in (r.out_offsets, r.in_idx, r.k_idx, r.neighbor_map)]
    before = ml.num_threads()
    try:
        runs = []
        for threads in (1, 4):
            ml.set_num_threads(threads)
            runs.append(arrays(_ext.build_relation(t, out, *g, False, "forward")))
            runs.append(arrays(_ext.build_relation(t, out, *g, False, "forward", _ext.CoordTable(out))))
            runs.append(arrays(_ext.build_relation(t, out, *g, False, "forward", _ext.CoordTable(other))))
    finally:
        ml.set_num_threads(before)
    assert len(runs[0][1]) == coords.shape[0]
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            np.testing.assert_array_equal(a, b)


def _network_pass(rng, dtype):
    """A U-Net-like pass over one sample (submanifold, strided and
    transposed layers, their input and weight gradients)."""
    from mlx_lattice import nn as lnn

    coords = oracle.random_coords(rng, 300, 10, 2)
    x = ml.SparseTensor(coords, rng.standard_normal((len(coords), 16)).astype(np.float32)).astype(dtype)
    layers = [lnn.SubmConv3d(16, 16, 3), lnn.Conv3d(16, 32, 2, stride=2), lnn.SubmConv3d(32, 32, 3),
              lnn.ConvTranspose3d(32, 16, 2, stride=2)]
    for layer in layers:
        layer.set_dtype(dtype)

    def loss(params, x):
        for layer, p in zip(layers, params):
            layer.update(p)
        y = x
        for layer in layers:
            y = layer(y)
        return y.feats.astype(mx.float32).sum()

    params = [layer.parameters() for layer in layers]
    value, grads = mx.value_and_grad(loss)(params, x)
    mx.eval(value, grads)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_sample_maps_freed_without_collector(rng, device):
    """A sample's relations (with the arrays they hold, GPU memory on a GPU)
    are freed when its last tensor goes, by reference counting: no cycle
    among relations, their swaps and views waits for the garbage collector."""
    import gc

    from mlx_lattice.backends import cuda
    from mlx_lattice.relation import Relation

    if device == "gpu" and not cuda.available():
        pytest.skip("needs MLX's CUDA backend and an NVIDIA GPU")
    dtype = mx.float16 if device == "gpu" else mx.float32
    live = lambda: sum(isinstance(o, Relation) for o in gc.get_objects())  # noqa: E731
    previous = mx.default_device()
    mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)
    gc.collect()
    gc.disable()
    try:
        before = live()
        _network_pass(rng, dtype)
        assert live() == before
    finally:
        gc.enable()
        mx.set_default_device(previous)
