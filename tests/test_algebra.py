"""Dense conversion, concatenation, addition, pruning and collation."""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import algebra, ops, pooling

import oracle
from conftest import to_np


def make(rng, n=50, extent=6, batches=2, c=3, low=None):
    coords = oracle.random_coords(rng, n, extent, batches, low)
    feats = rng.standard_normal((len(coords), c)).astype(np.float32)
    return ml.SparseTensor(coords, mx.array(feats)), coords, feats


def as_dict(x):
    return {tuple(map(int, c)): f for c, f in zip(np.array(x.coords), to_np(x.feats))}


def test_to_dense(rng):
    x, coords, feats = make(rng, low=0)
    d = algebra.to_dense(x)
    shape = (coords[:, 0].max() + 1, *(coords[:, 1:].max(0) + 1))
    assert d.shape == (*shape, 3)
    np.testing.assert_array_equal(to_np(d), oracle.dense_grid(coords, feats, shape))
    # explicit shape and origin, negative coordinates
    y, c2, f2 = make(rng, low=-3)
    d2 = algebra.to_dense(y, (3, 7, 7, 7), origin=(-3, -3, -3))
    np.testing.assert_array_equal(to_np(d2), oracle.dense_grid(c2, f2, (3, 7, 7, 7), (-3, -3, -3)))
    with pytest.raises(ValueError):
        algebra.to_dense(y)  # negative coordinates with the default origin
    # gradient: the cotangent read back at the voxels
    ct = rng.standard_normal(d2.shape).astype(np.float32)
    _, (g,) = mx.vjp(lambda f: algebra.to_dense(y.replace(f), (3, 7, 7, 7), origin=(-3, -3, -3)), [y.feats], [mx.array(ct)])
    np.testing.assert_array_equal(np.array(g), ct[c2[:, 0], *(c2[:, 1:] + 3).T])


def test_from_dense_threshold_mask_and_round_trip(rng):
    dense = rng.standard_normal((2, 4, 5, 3, 2)).astype(np.float32)
    dense[np.abs(dense).max(-1) < 1.0] = 0.0
    x = algebra.from_dense(mx.array(dense))
    nz = np.argwhere(np.abs(dense).max(-1) > 0)
    assert np.array_equal(np.array(x.coords), nz)
    np.testing.assert_array_equal(np.array(x.feats), dense[tuple(nz.T)])
    # threshold
    x2 = algebra.from_dense(mx.array(dense), threshold=1.5)
    keep = np.argwhere(np.abs(dense).max(-1) > 1.5)
    assert np.array_equal(np.array(x2.coords), keep)
    # mask, origin, no batch axis
    mask = rng.random((4, 5, 3)) < 0.3
    x3 = algebra.from_dense(mx.array(dense[1]), mask=mask, origin=(10, -2, 0), stride=2)
    cells = np.argwhere(mask)
    assert np.array_equal(np.array(x3.coords)[:, 1:], cells + [10, -2, 0])
    assert x3.stride == (2, 2, 2)
    np.testing.assert_array_equal(np.array(x3.feats), dense[1][tuple(cells.T)])
    # round trip
    back = algebra.to_dense(x, dense.shape[:4])
    np.testing.assert_array_equal(np.array(back), dense)
    # gradient flows to the dense input at the active cells only
    g = mx.grad(lambda d: algebra.from_dense(d, mask=np.abs(dense).max(-1) > 0).feats.sum())(mx.array(dense))
    np.testing.assert_array_equal(np.array(g), np.broadcast_to((np.abs(dense).max(-1) > 0)[..., None], dense.shape))


def test_cat(rng):
    x, coords, feats = make(rng)
    y = x.replace(mx.array(rng.standard_normal((len(coords), 2)).astype(np.float32)))
    z = algebra.cat([x, y])
    assert z.coordinate_set is x.coordinate_set and z.feats.shape == (len(coords), 5)
    np.testing.assert_array_equal(np.array(z.feats), np.concatenate([feats, np.array(y.feats)], 1))
    # the same voxels in another order, aligned by lookup
    perm = rng.permutation(len(coords))
    other_f = rng.standard_normal((len(coords), 4)).astype(np.float32)
    w = ml.SparseTensor(coords[perm], mx.array(other_f))
    z2 = algebra.cat([x, w])
    expected = np.concatenate([feats, other_f[np.argsort(perm)]], 1)
    np.testing.assert_array_equal(np.array(z2.feats), expected)
    # gradient reaches the permuted tensor in its own row order
    g = mx.grad(lambda f: (algebra.cat([x, w.replace(f)]).feats[:, 3:] * mx.arange(len(coords))[:, None]).sum())(w.feats)
    np.testing.assert_array_equal(np.array(g)[:, 0], perm.astype(np.float32))  # w row j is x row perm[j]
    # different voxels refuse
    v, _, _ = make(rng)
    with pytest.raises(ValueError):
        algebra.cat([x, v])


@pytest.mark.parametrize("mode", ["union", "intersection"])
def test_add(rng, mode):
    a, ca, fa = make(rng, n=40, extent=5)
    b, cb, fb = make(rng, n=40, extent=5)
    y = algebra.add(a, b, mode)
    ref = oracle.sparse_sum(ca, fa, cb, fb, mode)
    got = as_dict(y)
    assert set(got) == set(ref)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-6, atol=1e-6)
    # row order: a's rows first, in a's order
    ya = np.array(y.coords)
    in_b = {tuple(r) for r in cb.tolist()}
    a_rows = [r for r in ca.tolist() if mode == "union" or tuple(r) in in_b]
    assert ya[: len(a_rows)].tolist() == a_rows
    # gradients: each input gets the cotangent of its voxels' output rows
    ct = rng.standard_normal(y.feats.shape).astype(np.float32)
    _, (ga, gb) = mx.vjp(lambda p, q: algebra.add(a.replace(p), b.replace(q), mode).feats,
                         [a.feats, b.feats], [mx.array(ct)])
    out_rows = {tuple(map(int, c)): i for i, c in enumerate(ya)}
    for x_coords, g in ((ca, ga), (cb, gb)):
        expected = np.array([ct[out_rows[tuple(c)]] if tuple(c) in out_rows else np.zeros(3) for c in x_coords.tolist()])
        np.testing.assert_allclose(np.array(g), expected, rtol=1e-6, atol=1e-6)


def test_add_same_and_subset_sets(rng):
    a, ca, fa = make(rng)
    s = algebra.add(a, a.replace(a.feats * 2))
    assert s.coordinate_set is a.coordinate_set
    np.testing.assert_allclose(np.array(s.feats), 3 * fa, rtol=1e-6)
    sub = algebra.prune(a, np.arange(len(ca)) % 3 == 0)
    u = algebra.add(a, sub, "union")  # every voxel of sub is in a: a's set is kept
    assert u.coordinate_set is a.coordinate_set
    i = algebra.add(sub, a, "intersection")
    assert i.coordinate_set is sub.coordinate_set
    np.testing.assert_allclose(np.array(i.feats), 2 * fa[::3], rtol=1e-6)
    with pytest.raises(ValueError):
        algebra.add(a, ml.SparseTensor(ca, mx.zeros((len(ca), 3)), stride=2))


def test_prune(rng):
    x, coords, feats = make(rng)
    keep = rng.random(len(coords)) < 0.5
    y = algebra.prune(x, mx.array(keep))
    assert np.array_equal(np.array(y.coords), coords[keep])
    np.testing.assert_array_equal(np.array(y.feats), feats[keep])
    assert y.manager is x.manager
    assert algebra.prune(x, np.ones(len(coords), bool)) is x
    g = mx.grad(lambda f: algebra.prune(x.replace(f), keep).feats.sum())(x.feats)
    np.testing.assert_array_equal(np.array(g), np.broadcast_to(keep[:, None], feats.shape).astype(np.float32))


def test_sparse_collate(rng):
    a, ca, fa = make(rng, batches=2)
    c3 = np.unique(rng.integers(0, 4, (20, 3)), axis=0)
    f3 = rng.standard_normal((len(c3), 3)).astype(np.float32)
    b, cb, fb = make(rng, batches=1)
    y = algebra.sparse_collate([a, (c3, f3), b])
    expected = np.concatenate([
        ca,
        np.concatenate([np.full((len(c3), 1), 2), c3], 1),
        cb + [3, 0, 0, 0],
    ])
    assert np.array_equal(np.array(y.coords), expected)
    np.testing.assert_array_equal(np.array(y.feats), np.concatenate([fa, f3, fb]))
    assert y.num_batches == 4
    # a network sees separate scenes: a convolution of the collated batch
    # equals each scene convolved alone
    w = mx.array(rng.standard_normal((2, 3, 3, 3, 3)).astype(np.float32))
    yc = ops.subm_conv3d(y, w)
    alone = ops.subm_conv3d(b, w)
    np.testing.assert_allclose(np.array(yc.feats)[-len(cb):], np.array(alone.feats), rtol=1e-5, atol=1e-5)
    g = mx.grad(lambda f: algebra.sparse_collate([a, b.replace(f)]).feats.sum())(b.feats)
    np.testing.assert_array_equal(np.array(g), np.ones_like(fb))
    with pytest.raises(ValueError):
        algebra.sparse_collate([a, ml.SparseTensor(cb, mx.array(fb), stride=2)])


def test_reexports():
    assert ml.to_dense is algebra.to_dense and ml.sparse_collate is algebra.sparse_collate


def test_record_calls_collects_cat_and_fork_features(rng):
    x, _, _ = make(rng)
    with algebra.record_calls() as calls:
        a, b = algebra.fork(x)
        algebra.cat([a, b])
        algebra.fork(x.feats)
    algebra.cat([x, x])  # after the block: recorded nowhere
    assert [op for op, _ in calls] == ["fork", "cat", "fork"]
    assert calls[0][1][0] is x.feats and calls[2][1][0] is x.feats
    assert calls[1][1][0] is a.feats and calls[1][1][1] is b.feats


# ------------------------------------------------ finest-grid coordinates
@pytest.mark.parametrize("stride", [1, 2, (2, 3, 4)])
def test_finest_and_grid_coords(rng, stride):
    """t.finest_coords() multiplies by the stride (MinkowskiEngine's units);
    t.grid_coords() floor-divides back, against NumPy, negatives included."""
    coords = oracle.random_coords(rng, 60, 8, 2)  # x/y/z in [-4, 4)
    t = ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32), stride=stride)
    s = np.array([1, *t.stride])
    fine = t.finest_coords()
    assert fine.dtype == mx.int32
    np.testing.assert_array_equal(np.array(fine), coords.astype(np.int64) * s)
    np.testing.assert_array_equal(np.array(t.grid_coords(fine)), coords)
    # any finest voxel: the coarse voxel containing it (floor, not truncation)
    pts = np.concatenate([rng.integers(0, 2, (50, 1)), rng.integers(-20, 20, (50, 3))], axis=1)
    want = np.array([[p[0]] + [int(np.floor(p[a] / s[a])) for a in (1, 2, 3)] for p in pts])
    for layout in (pts, pts.tolist(), mx.array(pts.astype(np.int32)), mx.array(np.ascontiguousarray(pts.T)).T):
        np.testing.assert_array_equal(np.array(t.grid_coords(layout)), want)
    rows = np.array(ml.lookup(t, t.grid_coords(fine)))
    np.testing.assert_array_equal(rows, np.arange(len(t)))


def test_grid_coords_errors(rng):
    x, _, _ = make(rng, n=10)
    with pytest.raises(TypeError, match="coords must have an integer dtype"):
        x.grid_coords(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"coords must have shape \(N, 4\)"):
        x.grid_coords(np.zeros((2, 3), np.int32))
    big = ml.SparseTensor(np.array([[0, 65535, 0, 0]], np.int32), np.zeros((1, 1), np.float32), stride=2**16)
    with pytest.raises(ValueError, match="finest_coords: coordinates do not fit in int32"):
        big.finest_coords()


# ------------------------------------------------ docs/semantics.md, claim by claim
def _rows(t):
    return [tuple(map(int, r)) for r in np.array(t.coords)]


def test_claim_coords_are_int32_rows_of_any_integer_input(rng):
    c = oracle.random_coords(rng, 20, 5, 2)
    for given in (c.astype(np.int64), c.astype(np.int16), mx.array(c.astype(np.int64)), c.tolist()):
        t = ml.SparseTensor(given, np.zeros((len(c), 1), np.float32))
        assert t.coords.dtype == mx.int32 and t.coords.shape == (len(c), 4)
        np.testing.assert_array_equal(np.array(t.coords), c)


@pytest.mark.parametrize("row,ok", [((4095, 0, 0, 0), True), ((4096, 0, 0, 0), False), ((-1, 0, 0, 0), False),
                                    ((0, 65535, -65536, 0), True), ((0, 65536, 0, 0), False),
                                    ((0, 0, -65537, 0), False), ((0, 0, 0, 65536), False)])
def test_claim_coordinate_range(row, ok):
    make_it = lambda: ml.SparseTensor(np.array([row], np.int32), np.zeros((1, 1), np.float32))  # noqa: E731
    if ok:
        assert len(make_it()) == 1
    else:
        with pytest.raises(ValueError, match=r"batch in \[0, 4096\), x/y/z in \[-65536, 65535\]"):
            make_it()


def test_claim_generated_coordinates_out_of_range_raise():
    x = ml.SparseTensor(np.array([[0, 0, 65535, 0]], np.int32), np.ones((1, 1), np.float32))
    with pytest.raises(ValueError, match="leaves the supported range"):
        ops.generative_conv_transpose3d(x, mx.ones((1, 2, 2, 2, 1)), stride=2)


def test_claim_duplicates_raise_naming_both_rows():
    c = np.array([[0, 1, 2, 3], [0, 0, 0, 0], [1, 1, 2, 3], [0, 1, 2, 3]], np.int32)
    with pytest.raises(ValueError, match=r"duplicate rows 0 and 3 at \(0, 1, 2, 3\)"):
        ml.SparseTensor(c, np.zeros((4, 1), np.float32))


def test_claim_computed_tensors_keep_the_batch_size(rng):
    c = oracle.random_coords(rng, 60, 6, 2, low=0)
    x = ml.SparseTensor(c, rng.standard_normal((len(c), 2)).astype(np.float32),
                        batch_counts=[*np.bincount(c[:, 0]), 0, 0])
    w2 = mx.ones((2, 2, 2, 2, 2))
    kept = [ops.conv3d(x, w2, stride=2), ops.subm_conv3d(x, mx.ones((2, 3, 3, 3, 2))),
            ops.generative_conv_transpose3d(x, w2, stride=2), ops.conv_transpose3d(x, w2, stride=2),
            pooling.max_pool3d(x, 2), ml.prune(x, np.arange(len(x)) % 2 == 0), ml.crop(x, (0, 0, 0), (2, 2, 2)),
            ml.add(x, ml.crop(x, (0, 0, 0), (3, 3, 3)), mode="intersection"),
            ml.maximum(x, ml.crop(x, (0, 0, 0), (3, 3, 3)), mode="union")]
    assert [t.num_batches for t in kept] == [4] * len(kept)
    # an output placed on given coordinates has the batch size of those coordinates
    assert ops.conv3d(x, mx.ones((2, 3, 3, 3, 2)), padding=1, coordinates=c[c[:, 0] == 0]).num_batches == 1


def test_claim_feature_dtypes_and_matching_weights(rng):
    c = oracle.random_coords(rng, 20, 4, 1)
    x = ml.SparseTensor(c, rng.standard_normal((len(c), 2)).astype(np.float16))
    assert x.dtype == mx.float16
    y = ops.subm_conv3d(x, mx.ones((3, 3, 3, 3, 2), mx.float16), mx.zeros((3,), mx.float16))
    assert y.dtype == mx.float16
    with pytest.raises(TypeError, match="weight dtype"):
        ops.subm_conv3d(x, mx.ones((3, 3, 3, 3, 2)))
    with pytest.raises(TypeError, match="bias dtype"):
        ops.subm_conv3d(x, mx.ones((3, 3, 3, 3, 2), mx.float16), mx.zeros((3,)))
    with pytest.raises(TypeError, match="feats must be"):
        ml.SparseTensor(c, np.zeros((len(c), 2), np.int32))


def test_claim_flat_kernel_offset_order_breaks_max_ties():
    # inputs of one 2x2x2 cell at offsets (0,1,0) k=2, (1,0,0) k=4, (0,0,1) k=1,
    # all equal: k = (dx * Ky + dy) * Kz + dz = 1 wins and alone gets the gradient
    c = np.array([[0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1]], np.int32)
    x = ml.SparseTensor(c, np.ones((3, 1), np.float32))
    g = mx.grad(lambda f: pooling.max_pool3d(x.replace(f), 2).feats.sum())(x.feats)
    np.testing.assert_array_equal(np.array(g)[:, 0], [0, 0, 1])


def test_claim_supports_of_the_ops_table(rng):
    c = oracle.random_coords(rng, 50, 6, 2)
    perm = rng.permutation(len(c))
    x = ml.SparseTensor(c[perm], rng.standard_normal((len(c), 2)).astype(np.float32))
    w = lambda k, o=2: mx.array(rng.standard_normal((o, k, k, k, 2)).astype(np.float32))  # noqa: E731
    y = ops.conv3d(x, w(3), stride=2, padding=1)
    assert _rows(y) == sorted(_rows(y)) == sorted(map(tuple, np.asarray(oracle.forward_support(c, 3, 2, 1)).tolist()))
    assert ops.conv3d(x, w(1)).coordinate_set is x.coordinate_set  # 1x1x1, stride 1, no padding
    target = c[rng.permutation(len(c))[:20]]
    assert _rows(ops.conv3d(x, w(3), padding=1, coordinates=target)) == [tuple(r) for r in target.tolist()]
    assert ops.subm_conv3d(x, w(3)).coordinate_set is x.coordinate_set
    gen = ops.generative_conv_transpose3d(x, w(3), stride=2)
    want = sorted(map(tuple, np.asarray(oracle.generative_support(c, 3, 2)).tolist()))
    assert _rows(gen) == sorted(set(_rows(gen))) == want
    lone = ml.SparseTensor(c, np.ones((len(c), 2), np.float32))  # nothing recorded: lands on s * p
    assert _rows(ops.conv_transpose3d(lone, w(2), stride=2)) == [tuple(r) for r in (c * [1, 2, 2, 2]).tolist()]


def test_claim_even_submanifold_kernel_reads_itself_and_the_next_voxel(rng):
    c = oracle.random_coords(rng, 60, 5, 1)
    f = rng.standard_normal((len(c), 2)).astype(np.float32)
    w = rng.standard_normal((3, 2, 2, 2, 2)).astype(np.float32)
    y = ops.subm_conv3d(ml.SparseTensor(c, f), mx.array(w))
    np.testing.assert_allclose(np.array(y.feats), oracle.dense_conv(c, f, w, c, stride=1, padding=0),
                               rtol=1e-5, atol=1e-5)


def test_claim_output_strides(rng):
    c = oracle.random_coords(rng, 30, 6, 1, low=0)
    x = ml.SparseTensor(c, np.ones((len(c), 1), np.float32), stride=(4, 3, 2))
    w = mx.ones((1, 2, 2, 2, 1))
    assert ops.conv3d(x, w, stride=2).stride == (8, 6, 4)
    assert ops.conv_transpose3d(x, w, stride=2).stride == (2, 1, 1)  # 3 / 2: not divisible, 1
    assert ops.generative_conv_transpose3d(x, w, stride=2).stride == (2, 1, 1)
    fine = ml.SparseTensor(c, np.ones((len(c), 1), np.float32), stride=3)
    down = ops.conv3d(fine, w, stride=2)
    assert down.stride == (6, 6, 6)
    up = ops.conv_transpose3d(down, w, stride=2)
    assert up.coordinate_set is fine.coordinate_set and up.stride == (3, 3, 3)  # the recorded set's


def test_claim_groups_argument_errors(rng):
    c = oracle.random_coords(rng, 10, 4, 1)
    x = ml.SparseTensor(c, np.ones((len(c), 4), np.float32))
    with pytest.raises(TypeError, match="groups must be an int"):
        ops.subm_conv3d(x, mx.ones((4, 3, 3, 3, 2)), groups=2.0)
    with pytest.raises(ValueError, match="groups=3 must divide"):
        ops.subm_conv3d(x, mx.ones((6, 3, 3, 3, 1)), groups=3)
    with pytest.raises(ValueError, match="groups"):
        ops.subm_conv3d(x, mx.ones((4, 3, 3, 3, 4)), groups=0)


def test_claim_empty_inputs_and_edgeless_targets(rng):
    e = ml.SparseTensor(np.zeros((0, 4), np.int32), np.zeros((0, 2), np.float32))
    w = mx.ones((3, 3, 3, 3, 2))
    assert ops.subm_conv3d(e, w).shape == (0, 3) and ops.conv3d(e, w, stride=2).shape == (0, 3)
    gw = mx.grad(lambda v: ops.subm_conv3d(e, v).feats.sum())(w)
    np.testing.assert_array_equal(np.array(gw), np.zeros(w.shape))
    x = ml.SparseTensor(np.array([[0, 0, 0, 0]], np.int32), np.ones((1, 2), np.float32))
    far = np.array([[0, 9, 9, 9], [0, 0, 0, 1]], np.int32)  # the first has no incoming edge
    b = mx.array([1.0, 2.0, 3.0])
    y = ops.conv3d(x, w, b, padding=1, coordinates=far)
    np.testing.assert_array_equal(np.array(y.feats)[0], [1, 2, 3])
    np.testing.assert_array_equal(np.array(ops.conv3d(x, w, padding=1, coordinates=far).feats)[0], [0, 0, 0])


def test_claim_dense_conversions(rng):
    x, c, f = make(rng, n=40, extent=5, low=0)
    with pytest.raises(ValueError, match="outside the grid"):
        ml.to_dense(x, (2, 2, 2))
    dense = np.zeros((1, 3, 3, 3, 2), np.float32)
    dense[0, 2, 0, 1] = [0.5, 0.0]
    dense[0, 0, 1, 2] = [0.0, -2.0]
    dense[0, 1, 1, 1] = [0.1, 0.1]
    t = ml.from_dense(mx.array(dense), threshold=0.2)
    assert _rows(t) == [(0, 0, 1, 2), (0, 2, 0, 1)]  # |value| > 0.2 somewhere, rows sorted
    assert _rows(ml.from_dense(mx.array(dense), origin=(1, 0, 0))) == [(0, 1, 1, 2), (0, 2, 1, 1), (0, 3, 0, 1)]


def test_claim_cat_any_row_order_keeps_the_first_set(rng):
    x, c, f = make(rng)
    perm = rng.permutation(len(c))
    other = ml.SparseTensor(c[perm], f[perm])
    y = ml.cat([x, other])
    assert y.coordinate_set is x.coordinate_set
    np.testing.assert_array_equal(np.array(y.feats), np.concatenate([f, f], axis=1))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "maximum", "minimum"])
def test_claim_different_voxels_without_a_mode_raise_naming_mode(rng, op):
    # docs/semantics.md once said mul defaulted to an intersection: no op has a
    # default support; the error names the mode argument and both choices
    a, _, _ = make(rng, n=30)
    b = ml.prune(a, np.arange(len(a)) % 2 == 0)
    with pytest.raises(ValueError, match=rf"{op}: a and b hold different voxels.*mode='union'.*mode='intersection'"):
        getattr(ml, op)(a, b)
    inter = getattr(ml, op)(b, a, mode="intersection")
    assert inter.coordinate_set is b.coordinate_set  # the support equals b's: b's set kept
    assert getattr(ml, op)(a, b, mode="union").coordinate_set is a.coordinate_set


def test_claim_maximum_treats_a_missing_voxel_as_absent(rng):
    a = ml.SparseTensor(np.array([[0, 0, 0, 0], [0, 1, 0, 0]], np.int32), -np.ones((2, 1), np.float32))
    b = ml.SparseTensor(np.array([[0, 1, 0, 0], [0, 2, 0, 0]], np.int32), -2 * np.ones((2, 1), np.float32))
    y = ml.maximum(a, b, mode="union")
    assert _rows(y) == [(0, 0, 0, 0), (0, 1, 0, 0), (0, 2, 0, 0)]
    np.testing.assert_array_equal(np.array(y.feats)[:, 0], [-1, -1, -2])  # not max(-2, 0)
    np.testing.assert_array_equal(np.array(ml.add(a, b, mode="union").feats)[:, 0], [-1, -3, -2])


def test_claim_row_selections_and_collation(rng):
    x, c, f = make(rng, n=60, batches=2)
    keep = rng.random(len(c)) < 0.5
    assert _rows(ml.prune(x, keep)) == [tuple(r) for r in c[keep].tolist()]
    start = np.array([[-3, -3, -3], [0, 0, 0]])
    inside = ((c[:, 1:] >= start[c[:, 0]]) & (c[:, 1:] < 2)).all(axis=1)
    assert _rows(ml.crop(x, start, (2, 2, 2))) == [tuple(r) for r in c[inside].tolist()]
    y = ml.sparse_collate([x, x])
    assert y.num_batches == 4
    assert _rows(y) == [tuple(r) for r in c.tolist()] + [(b + 2, *p) for b, *p in c.tolist()]


def test_claim_points_lie_in_floor_voxels():
    pts = np.array([[-0.01, 0.0, 0.49], [0.5, -0.5, 1.0], [0.26, 0.0, 0.2]])
    q = ml.sparse_quantize(pts, 0.25)
    q = np.array(q[0] if isinstance(q, tuple) else q)
    assert q.tolist() == sorted(np.unique(np.concatenate(
        [np.zeros((3, 1), np.int64), np.floor(pts / 0.25).astype(np.int64)], axis=1), axis=0).tolist())
