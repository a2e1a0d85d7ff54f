"""Point Transformer V3: pooling and unpooling against NumPy references,
shapes and dtypes, order shuffling, batch independence, a short training run."""

import numpy as np
import pytest
import mlx.core as mx
import mlx.nn as mnn
import mlx.optimizers as optim

import mlx_lattice as ml
from mlx_lattice import nn
from mlx_lattice.models import PointTransformerV3, SerializedPooling, SerializedUnpooling

import oracle
from conftest import to_np

SMALL = dict(enc_channels=(8, 16), enc_depths=(1, 2), enc_heads=(2, 2), dec_channels=(8,), dec_depths=(1,),
             dec_heads=(2,), patch_size=16, stem_kernel=3)


def make(rng, n=150, extent=8, batches=2, c=3):
    coords = oracle.random_coords(rng, n, extent, batches)
    feats = rng.standard_normal((len(coords), c)).astype(np.float32)
    return ml.SparseTensor(coords, feats), coords, feats


def gelu(h):
    return 0.5 * h * (1 + np.vectorize(__import__("math").erf)(h / np.sqrt(2)))


def test_serialized_pooling_is_grid_max_pooling(rng):
    x, coords, feats = make(rng, c=4)
    pool = SerializedPooling(4, 6)
    pool.eval()
    y = pool(x)
    assert y.stride == (2, 2, 2)
    proj = feats.astype(np.float64) @ to_np(pool.proj.weight).T + to_np(pool.proj.bias)
    parent = np.concatenate([coords[:, :1], coords[:, 1:] // 2], axis=1)
    cells = np.unique(parent, axis=0)
    assert np.array_equal(np.array(y.coords), cells)
    pooled = np.stack([proj[(parent == cell).all(1)].max(0) for cell in cells])
    bn = pool.norm
    ref = gelu((pooled - to_np(bn.running_mean)) / np.sqrt(to_np(bn.running_var) + 1e-5))
    np.testing.assert_allclose(to_np(y.feats), ref, rtol=1e-4, atol=1e-4)


def test_serialized_unpooling_adds_parent_features(rng):
    x, coords, feats = make(rng, c=4)
    coarse = nn.MaxPool3d(2)(x)
    unpool = SerializedUnpooling(4, 4, 5)
    unpool.eval()
    y = unpool(coarse, x)
    assert y.coordinate_set is x.coordinate_set

    def branch(seq, f):
        lin, bn = seq.layers[0], seq.layers[1]
        h = f @ to_np(lin.weight).T + to_np(lin.bias)
        return gelu((h - to_np(bn.running_mean)) / np.sqrt(to_np(bn.running_var) + 1e-5))

    cc = np.array(coarse.coords)
    lookup = {tuple(r): i for i, r in enumerate(cc.tolist())}
    parent = [lookup[(r[0], *(v // 2 for v in r[1:]))] for r in coords.tolist()]
    ref = branch(unpool.proj_skip, feats.astype(np.float64)) + branch(unpool.proj, to_np(coarse.feats))[parent]
    np.testing.assert_allclose(to_np(y.feats), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="enclosing"):
        other, _, _ = make(np.random.default_rng(99), c=4, extent=30)
        unpool(coarse, other)


def test_shapes_dtypes_and_rows(rng):
    x, coords, _ = make(rng)
    model = PointTransformerV3(3, 5, **SMALL)
    y = model(x)
    assert y.coordinate_set is x.coordinate_set and y.shape == (len(coords), 5) and y.dtype == mx.float32
    assert model.features(x).shape == (len(coords), 8)
    assert PointTransformerV3(3, **SMALL)(x).shape == (len(coords), 8)
    model.set_dtype(mx.float16)
    y16 = model(x.astype(mx.float16))
    assert y16.dtype == mx.float16 and np.isfinite(to_np(y16.feats)).all()
    # A one-stage network and the default three-stage one.
    one = PointTransformerV3(3, 2, enc_channels=(8,), enc_depths=(1,), enc_heads=(2,), dec_channels=(),
                             dec_depths=(), dec_heads=(), patch_size=8, stem_kernel=3)
    assert one(x).shape == (len(coords), 2)
    assert PointTransformerV3(3, 4, patch_size=32)(x).shape == (len(coords), 4)


def test_compiled_forward_matches_eager(rng):
    x, _, _ = make(rng)
    model = PointTransformerV3(3, 4, **SMALL)
    model.eval()
    forward = mx.compile(lambda f: model(x.replace(f)).feats)
    np.testing.assert_allclose(np.array(forward(x.feats)), np.array(model(x).feats), rtol=1e-5, atol=1e-6)


def test_empty_batch_item_and_tiny_input():
    coords = np.array([[0, 0, 0, 0], [0, 1, 0, 0], [2, 5, 5, 5]], np.int32)
    x = ml.SparseTensor(coords, np.ones((3, 3), np.float32))
    model = PointTransformerV3(3, 2, **SMALL)
    model.eval()
    assert np.isfinite(np.array(model(x).feats)).all()


def test_eval_is_batch_independent_and_training_shuffles_orders(rng):
    x, coords, feats = make(rng, batches=2)
    # Item 1 spans a larger box than item 0: the Hilbert orders must not notice.
    coords[coords[:, 0] == 1, 1] *= 2  # depth 4 instead of 3 for the whole tensor
    x = ml.SparseTensor(coords, feats)
    model = PointTransformerV3(3, 4, orders=("hilbert", "z-trans"), **SMALL)
    model.eval()
    rows0 = coords[:, 0] == 0
    alone = ml.SparseTensor(coords[rows0], feats[rows0])
    np.testing.assert_allclose(np.array(model(alone).feats), np.array(model(x).feats)[rows0], rtol=1e-5, atol=1e-5)
    # Training mode: the seed fixes the shuffled curve order.
    model.train()
    outs = {}
    for seed in range(6):
        mx.random.seed(seed)
        outs[seed] = np.array(model(x).feats)
    mx.random.seed(0)
    np.testing.assert_array_equal(np.array(model(x).feats), outs[0])
    assert any(not np.allclose(outs[0], o) for o in outs.values())


def test_training_reduces_loss(rng):
    mx.random.seed(1)
    x, coords, _ = make(rng, n=200, extent=8, batches=2)
    labels = mx.array((coords[:, 1] + coords[:, 3] > 0).astype(np.int32))
    model = PointTransformerV3(3, 2, **SMALL, drop_path=0.1)
    opt = optim.Adam(learning_rate=3e-3)

    def loss_fn(m):
        return mnn.losses.cross_entropy(m(x).feats, labels, reduction="mean")

    step = mnn.value_and_grad(model, loss_fn)
    losses = []
    for _ in range(12):
        loss, grads = step(model)
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state)
        losses.append(loss.item())
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.8 * losses[0]


def test_drop_path_schedule():
    model = PointTransformerV3(3, **{**SMALL, "enc_depths": (1, 2), "dec_depths": (2,)}, drop_path=0.3)
    assert [b.drop_path for stage in model.enc for b in stage] == pytest.approx([0.0, 0.15, 0.3])
    assert [b.drop_path for b in model.dec[0]] == pytest.approx([0.3, 0.0])


def test_bad_arguments():
    with pytest.raises(ValueError, match="stages - 1"):
        PointTransformerV3(3, enc_channels=(8, 16), enc_depths=(1, 1), enc_heads=(2, 2))
    with pytest.raises(ValueError, match="orders"):
        PointTransformerV3(3, orders=("peano",), **{k: v for k, v in SMALL.items()})
    with pytest.raises(ValueError, match="patch_size"):
        PointTransformerV3(3, **{**SMALL, "patch_size": (8, 8, 8)})
    with pytest.raises(TypeError, match="SparseTensor"):
        PointTransformerV3(3, **SMALL)(mx.zeros((4, 3)))
