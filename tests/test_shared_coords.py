"""Tensors sharing one coordinate set: a new tensor, or anything done to or
with one tensor, never changes what another tensor sees (its rows, stride,
batch size, global pooling shape, or what is computed from it)."""

from __future__ import annotations

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import algebra, decoder, nn, ops, pooling

import oracle


def _tensor(rng, n=80, batches=2, channels=3, extent=6):
    coords = oracle.random_coords(rng, n, extent=extent, batches=batches, low=0)
    feats = rng.standard_normal((len(coords), channels)).astype(np.float32)
    return ml.SparseTensor(coords, feats), coords, feats


def _view(t):
    """Everything a tensor shows of its coordinate set, as plain values."""
    return {
        "coords": np.array(t.coords).tolist(),
        "stride": t.stride,
        "num_batches": t.num_batches,
        "batch_counts": np.array(t.batch_counts).tolist(),
        "pool_shape": tuple(pooling.global_avg_pool(t).shape),
        "dense_batches": ml.to_dense(t).shape[0],
    }


def _counts(coords, n):
    return np.bincount(np.asarray(coords)[:, 0], minlength=n).tolist()


# ------------------------------------------------ batch_counts on a shared set
def test_batch_counts_on_another_tensors_coords_leave_it_alone(rng):
    x, coords, feats = _tensor(rng)
    before = _view(x)
    assert before["num_batches"] == 2
    f = rng.standard_normal(feats.shape).astype(np.float32)
    y = ml.SparseTensor(x.coords, f, batch_counts=list(x.batch_counts) + [0, 0])
    assert _view(x) == before  # x's batch size and pooled shape unchanged
    assert y.num_batches == 4 and y.batch_counts.tolist() == _counts(coords, 4)
    assert pooling.global_avg_pool(y).shape == (4, 3)
    # y keeps x's manager, rows and stride
    assert y.manager is x.manager and y.stride == x.stride
    assert np.array_equal(np.array(y.coords), coords)
    # what is computed from each keeps its own batch size
    w = mx.array(rng.standard_normal((2, 2, 2, 2, 3)).astype(np.float32))
    assert ops.conv3d(x, w, stride=2).num_batches == 2
    assert ops.conv3d(y, w, stride=2).num_batches == 4
    assert ml.prune(y, np.arange(len(y)) % 2 == 0).num_batches == 4
    # the features of a pooled y are x's oracle plus two zero rows
    b = coords[:, 0]
    want = np.stack([f[b == i].mean(0) for i in range(2)] + [np.zeros(3)] * 2)
    np.testing.assert_allclose(np.array(pooling.global_avg_pool(y)), want, rtol=1e-5, atol=1e-6)


def test_convolution_outputs_computed_earlier_keep_their_batch_size(rng):
    # A derived set takes its batch size from the set it came from: growing
    # that set later would reach back into outputs already computed.
    x, coords, _ = _tensor(rng)
    w = mx.array(rng.standard_normal((4, 2, 2, 2, 3)).astype(np.float32))
    down = ops.conv3d(x, w, stride=2)
    sub = ops.subm_conv3d(x, mx.zeros((2, 3, 3, 3, 3)))
    views = {"x": _view(x), "down": _view(down), "sub": _view(sub)}
    ml.SparseTensor(x.coords, np.zeros((len(x), 1), np.float32), batch_counts=[*x.batch_counts, 0, 0, 0])
    ml.SparseTensor(down.coords, np.zeros((len(down), 1), np.float32), batch_counts=[*down.batch_counts, 0])
    assert {"x": _view(x), "down": _view(down), "sub": _view(sub)} == views


def test_a_users_array_shared_by_two_tensors(rng):
    _, coords, feats = _tensor(rng)
    m = mx.array(coords)
    a = ml.SparseTensor(m, feats)
    before = _view(a)
    b = ml.SparseTensor(m, feats, batch_counts=_counts(coords, 3))
    assert _view(a) == before and b.num_batches == 3
    # declared when the set is made: later tensors on the array join it
    m2 = mx.array(coords)
    c = ml.SparseTensor(m2, feats, batch_counts=_counts(coords, 5))
    d = ml.SparseTensor(m2, feats)
    assert d.coordinate_set is c.coordinate_set and d.num_batches == 5
    # a smaller batch size is the one asked for, and c keeps its own
    e = ml.SparseTensor(m2, feats, batch_counts=_counts(coords, 2))
    assert e.num_batches == 2 and c.num_batches == 5 and d.num_batches == 5


def test_target_coordinates_of_an_earlier_op_keep_their_batch_size(rng):
    x, coords, _ = _tensor(rng)
    target = mx.array(coords[::2])
    w = mx.array(rng.standard_normal((2, 3, 3, 3, 3)).astype(np.float32))
    y = ops.conv3d(x, w, padding=1, coordinates=target)
    before = _view(y)
    z = ml.SparseTensor(target, np.zeros((target.shape[0], 2), np.float32), batch_counts=_counts(coords[::2], 6))
    assert z.manager is x.manager and z.num_batches == 6
    assert _view(y) == before


def test_same_batch_size_joins_the_set(rng):
    x, coords, feats = _tensor(rng)
    y = ml.SparseTensor(x.coords, feats, batch_counts=list(x.batch_counts))
    assert y.coordinate_set is x.coordinate_set
    # two tensors asking for the same larger batch size share one new set
    a = ml.SparseTensor(x.coords, feats, batch_counts=_counts(coords, 4))
    b = ml.SparseTensor(x.coords, feats, batch_counts=_counts(coords, 4))
    assert a.coordinate_set is b.coordinate_set is not x.coordinate_set
    # and rebuilding from a's coordinates joins a's set, as for any tensor
    c = ml.SparseTensor(a.coords, feats)
    assert c.coordinate_set is a.coordinate_set and c.num_batches == 4
    # same voxels on two sets: element-wise ops align them (x's rows and set)
    s = ml.add(x, a)
    assert s.coordinate_set is x.coordinate_set
    np.testing.assert_allclose(np.array(s.feats), 2 * feats, rtol=1e-6)


def test_transposed_conv_from_a_resized_set_lands_on_the_encoder_voxels(rng):
    x, coords, feats = _tensor(rng, n=120, extent=8)
    w_down = mx.array(rng.standard_normal((5, 2, 2, 2, 3)).astype(np.float32))
    w_up = mx.array(rng.standard_normal((3, 2, 2, 2, 5)).astype(np.float32))
    down = ops.conv3d(x, w_down, stride=2)
    f = rng.standard_normal((len(down), 5)).astype(np.float32)
    v = ml.SparseTensor(down.coords, f, batch_counts=[*down.batch_counts, 0])
    assert v.coordinate_set is not down.coordinate_set and v.stride == (2, 2, 2)
    up = ops.conv_transpose3d(v, w_up, stride=2)
    assert up.coordinate_set is x.coordinate_set
    want = oracle.dense_conv_transpose(np.array(down.coords), f, np.array(w_up), coords, stride=2)
    np.testing.assert_allclose(np.array(up.feats), want, rtol=1e-4, atol=1e-4)
    assert down.num_batches == 2


# ------------------------------------------------ other constructor keywords
def test_stride_and_manager_keywords_leave_the_set_alone(rng):
    x, _, feats = _tensor(rng)
    before = _view(x)
    with pytest.raises(ValueError, match="stride .* disagrees"):
        ml.SparseTensor(x.coords, feats, stride=2)
    assert _view(x) == before
    other = ml.CoordinateManager()
    o = ml.SparseTensor(x.coords, feats, stride=4, manager=other, batch_counts=[*x.batch_counts, 0])
    assert o.manager is other and o.stride == (4, 4, 4) and o.num_batches == 3
    assert _view(x) == before
    # the array keeps its first owner: rebuilding from it still joins x
    assert ml.SparseTensor(x.coords, feats).coordinate_set is x.coordinate_set


# ------------------------------------------------ setters and in-place writes
def test_shared_metadata_is_read_only(rng):
    x, _, feats = _tensor(rng)
    y = x.replace(feats * 2)
    cset = y.coordinate_set
    for name, value in (("coords", mx.zeros((1, 4), mx.int32)), ("stride", (2, 2, 2)), ("source", None)):
        with pytest.raises(AttributeError):
            setattr(cset, name, value)
    with pytest.raises(AttributeError):
        y.manager = ml.CoordinateManager()
    with pytest.raises(AttributeError):
        y.stride = (2, 2, 2)
    with pytest.raises(AttributeError):
        y.coords = mx.zeros((len(y), 4), mx.int32)
    assert not hasattr(cset, "declare_batches")  # no public way to grow a set's batch size
    # the cached batch counts, plain and padded, are not writable
    with pytest.raises(ValueError, match="read-only"):
        y.batch_counts[0] = 1000
    padded = ml.SparseTensor(mx.array(np.array(x.coords)), feats, batch_counts=[*x.batch_counts, 0])
    with pytest.raises(ValueError, match="read-only"):
        padded.batch_counts[-1] = 1
    assert x.batch_counts.tolist() == y.batch_counts.tolist() and sum(x.batch_counts) == len(x)
    # features are per tensor: setting y's leaves x's
    y.feats = mx.zeros_like(y.feats)
    np.testing.assert_array_equal(np.array(x.feats), feats)


def test_ops_on_a_tensor_leave_every_tensor_on_its_set_alone(rng):
    x, coords, feats = _tensor(rng, n=100, extent=6)
    twin = x.replace(feats + 1)
    before = _view(twin)
    one = x.replace(mx.array(feats[:, :1]))
    results = [
        x.astype(mx.float16),
        *algebra.fork(x),
        ml.cat([x, twin]),
        ml.add(x, twin),
        ml.mul(x, ml.prune(twin, np.arange(len(x)) % 3 == 0), mode="intersection"),
        ml.maximum(x, ml.crop(twin, (0, 0, 0), (3, 3, 3)), mode="union"),
        ml.top_k(one, 5),
        decoder.prune_by_logits(one, one, 0.0, keep=ml.crop(x, (0, 0, 0), (2, 6, 6))),
        ml.sparse_collate([x, twin], manager=x.manager),
        ml.from_dense(ml.to_dense(x), manager=x.manager),
        decoder.expand(x, 2),
        decoder.downsample(x, 2),
        decoder.upsample(decoder.downsample(x, 2), x.coords),
        pooling.max_pool3d(x, 2),
        nn.BatchNorm(3)(x),
        ml.SparseTensor(x.coords, feats, batch_counts=[*x.batch_counts, 0, 0]),
        ml.SparseTensor(x.coords, feats, manager=ml.CoordinateManager()),
    ]
    assert all(isinstance(r, ml.SparseTensor) for r in results)
    assert _view(twin) == before and _view(x) == before
    assert np.array_equal(np.array(x.coords), coords)


def test_with_batches_checks_its_batch_size(rng):
    x, coords, _ = _tensor(rng)
    m = x.manager
    assert m.with_batches(x.coordinate_set, 2) is x.coordinate_set
    v = m.with_batches(x.coordinate_set, 5)
    assert v.num_batches == 5 and v.stride == x.stride and x.num_batches == 2
    np.testing.assert_array_equal(np.array(v.coords), coords)
    for bad in (1, 2.0, True):
        with pytest.raises(ValueError, match=r"n must be an int >= 2"):
            m.with_batches(x.coordinate_set, bad)
