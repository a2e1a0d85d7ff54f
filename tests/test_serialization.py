"""Curve codes and orders against bit-by-bit references written here."""

import itertools

import numpy as np
import pytest
import mlx.core as mx

from mlx_lattice import SparseTensor
from mlx_lattice.serialization import CURVES, MAX_DEPTH, curve_code, serialization_order, serialize


# ------------------------------------------------------------------ oracle
def ref_morton(x, y, z, depth):
    code = 0
    for i in range(depth - 1, -1, -1):  # most significant level first
        for v in (x, y, z):
            code = (code << 1) | ((v >> i) & 1)
    return code


def ref_hilbert(x, y, z, depth):
    """Skilling's AxesToTranspose on one point, then bit interleaving."""
    X = [x, y, z]
    m = 1 << (depth - 1)
    q = m
    while q > 1:
        p = q - 1
        for i in range(3):
            if X[i] & q:
                X[0] ^= p
            else:
                t = (X[0] ^ X[i]) & p
                X[0] ^= t
                X[i] ^= t
        q >>= 1
    for i in range(1, 3):
        X[i] ^= X[i - 1]
    t = 0
    q = m
    while q > 1:
        if X[2] & q:
            t ^= q - 1
        q >>= 1
    X = [v ^ t for v in X]
    return ref_morton(X[0], X[1], X[2], depth)


def ref_code(p, curve, depth):
    x, y, z = (int(v) for v in p)
    if curve.endswith("-trans"):
        x, y = y, x
    return (ref_hilbert if curve.startswith("hilbert") else ref_morton)(x, y, z, depth)


def ref_keys(coords, curve, depth=None):
    c = np.asarray(coords, dtype=np.int64)
    if len(c) == 0:
        return []
    shifted = c.copy()
    for b in np.unique(c[:, 0]):
        rows = c[:, 0] == b
        shifted[rows, 1:] -= c[rows, 1:].min(axis=0)
    if depth is None:
        depth = max(1, int(shifted[:, 1:].max()).bit_length())
    return [(int(r[0]) << (3 * depth)) | ref_code(r[1:], curve, depth) for r in shifted]


def random_coords(rng, n, batches=3, lo=-40, hi=40):
    pts = set()
    while len(pts) < n:
        pts.add((int(rng.integers(batches)), *(int(v) for v in rng.integers(lo, hi, 3))))
    c = np.array(sorted(pts), dtype=np.int32).reshape(-1, 4)
    return c[rng.permutation(len(c))]


# ------------------------------------------------------------------ codes
@pytest.mark.parametrize("curve", CURVES)
@pytest.mark.parametrize("depth", [1, 2, 3, 5, 17])
def test_curve_code_matches_bitwise_reference(curve, depth):
    rng = np.random.default_rng(depth)
    pts = rng.integers(0, 1 << depth, size=(200, 3))
    got = curve_code(pts, curve, depth)
    assert got.dtype == np.int64
    assert got.tolist() == [ref_code(p, curve, depth) for p in pts]


def test_morton_known_values():
    assert curve_code([[1, 0, 0], [0, 1, 0], [0, 0, 1], [3, 3, 3]], "z", 2).tolist() == [4, 2, 1, 63]
    assert curve_code([[1, 0, 0]], "z-trans", 2).tolist() == [2]


@pytest.mark.parametrize("curve", CURVES)
@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_curves_are_bijections_and_hilbert_is_continuous(curve, depth):
    side = 1 << depth
    cube = np.array(list(itertools.product(range(side), repeat=3)))
    code = curve_code(cube, curve, depth)
    assert sorted(code.tolist()) == list(range(side**3))
    path = cube[np.argsort(code)]
    steps = np.abs(np.diff(path, axis=0)).sum(axis=1)
    if curve.startswith("hilbert"):
        assert (steps == 1).all()  # each step moves to a face neighbour
        assert path[0].tolist() == [0, 0, 0]
    else:
        assert steps.max() > 1 or depth == 0


# ------------------------------------------------------------------ keys and orders
@pytest.mark.parametrize("curve", CURVES)
def test_serialize_matches_reference_with_negative_coords_and_batches(curve):
    rng = np.random.default_rng(7)
    c = random_coords(rng, 300)
    assert serialize(c, curve).tolist() == ref_keys(c, curve)
    assert serialize(mx.array(c), curve, depth=9).tolist() == ref_keys(c, curve, depth=9)
    grouped = c[np.argsort(c[:, 0], kind="stable")]  # rows grouped by batch take another path
    assert serialize(grouped, curve).tolist() == ref_keys(grouped, curve)


def test_shift_is_per_batch_item():
    c = np.array([[0, 5, 5, 5], [0, 6, 5, 5], [1, -3, -3, -3], [1, -2, -3, -3]], np.int32)
    key = serialize(c, "z")
    # Both items start at their own origin: same codes below the batch bits.
    assert key.tolist() == [0, 4, (1 << 3) + 0, (1 << 3) + 4]


@pytest.mark.parametrize("curve", CURVES)
def test_order_groups_batches_and_sorts_codes(curve):
    rng = np.random.default_rng(3)
    c = random_coords(rng, 500, batches=4)
    order, inverse = serialization_order(c, curve)
    assert order.dtype == np.int64 and inverse.dtype == np.int64
    assert np.array_equal(order[inverse], np.arange(len(c)))
    b = c[order, 0]
    assert (np.diff(b) >= 0).all()
    ref = np.array(ref_keys(c, curve))
    assert (np.diff(ref[order]) > 0).all()


def test_order_of_sparse_tensor_coords_and_empty():
    rng = np.random.default_rng(0)
    c = random_coords(rng, 50)
    x = SparseTensor(c, np.zeros((50, 2), np.float32))
    order, _ = serialization_order(x.coords, "hilbert")
    assert sorted(order.tolist()) == list(range(50))
    assert np.array_equal(serialize(x, "hilbert"), serialize(c, "hilbert"))
    order, inverse = serialization_order(np.zeros((0, 4), np.int32))
    assert order.shape == (0,) and inverse.shape == (0,)
    assert serialize(np.zeros((0, 4), np.int32), "z").shape == (0,)


def test_full_coordinate_range_fits():
    c = np.array([[4095, -65536, -65536, -65536], [4095, 65535, 65535, 65535]], np.int32)
    key = serialize(c, "hilbert")
    assert (key >= 0).all() and key.tolist() == ref_keys(c, "hilbert")
    assert int(key.max()).bit_length() <= 63


def test_bad_arguments():
    with pytest.raises(ValueError, match="curve"):
        serialize(np.zeros((1, 4), np.int32), "peano")
    with pytest.raises(ValueError, match="depth"):
        serialize(np.zeros((1, 4), np.int32), "z", depth=MAX_DEPTH + 1)
    with pytest.raises(ValueError, match="depth 2"):
        serialize(np.array([[0, 0, 0, 0], [0, 4, 0, 0]], np.int32), "z", depth=2)
    with pytest.raises(ValueError, match="shape"):
        serialize(np.zeros((3, 3), np.int32))
    with pytest.raises(TypeError, match="integer"):
        serialize(np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match="xyz values"):
        curve_code([[-1, 0, 0]], "z", 4)
    with pytest.raises(ValueError, match="xyz"):
        curve_code([[1, 0]], "z", 4)
