"""What a user coming from spconv / TorchSparse runs into: tensors rebuilt
from another tensor's coordinates, element-wise ops on different voxel sets,
empty batch items, half-precision training, attribute and layer hints, and
the code of docs/spconv.md (and the other pages written for them)."""

from __future__ import annotations

import gc
import importlib
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import mlx.core as mx
import mlx.nn as mnn
from mlx.utils import tree_flatten, tree_unflatten

import mlx_lattice as ml
import mlx_lattice.optimizers as optim
from mlx_lattice import nn, ops, pooling
from mlx_lattice.manager import owner_of
from mlx_lattice.models import MinkUNet

import oracle

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _tensor(rng, n=120, extent=8, batches=1, channels=4, low=0):
    coords = oracle.random_coords(rng, n, extent=extent, batches=batches, low=low)
    feats = rng.standard_normal((len(coords), channels)).astype(np.float32)
    return ml.SparseTensor(coords, feats), coords, feats


def _keys(coords):
    return [tuple(int(v) for v in r) for r in np.asarray(coords)]


# ------------------------------------------------ tensors on another's coords
def test_coords_of_a_live_tensor_join_its_manager(rng):
    x, coords, feats = _tensor(rng)
    w_down = mx.array(rng.standard_normal((6, 2, 2, 2, 4)).astype(np.float32))
    w_up = mx.array(rng.standard_normal((4, 2, 2, 2, 6)).astype(np.float32))
    down = ops.conv3d(x, w_down, stride=2)
    f = down.feats * 2

    rebuilt = ml.SparseTensor(down.coords, f)  # no stride, no manager given
    assert rebuilt.manager is down.manager
    assert rebuilt.coordinate_set is down.coordinate_set
    assert rebuilt.stride == (2, 2, 2)
    up = ops.conv_transpose3d(rebuilt, w_up, stride=2)
    assert up.coordinate_set is x.coordinate_set  # back on the encoder's voxels
    expected = oracle.dense_conv_transpose(np.array(down.coords), np.array(f), np.array(w_up), coords, stride=2)
    np.testing.assert_allclose(np.array(up.feats), expected, rtol=1e-4, atol=1e-4)

    # a copy of the coordinates: a new manager, the transposed conv lands on 2 * p
    copied = ml.SparseTensor(np.array(down.coords), f, stride=2)
    assert copied.manager is not down.manager
    lost = ops.conv_transpose3d(copied, w_up, stride=2)
    assert _keys(lost.coords) == _keys(np.array(down.coords) * [1, 2, 2, 2])

    # an explicit manager is respected; an explicit stride must agree
    other = ml.CoordinateManager()
    assert ml.SparseTensor(down.coords, f, manager=other).manager is other
    with pytest.raises(ValueError, match=r"stride \(1, 1, 1\) disagrees.*replace\(feats\)"):
        ml.SparseTensor(down.coords, f, stride=1)


def test_a_users_coordinate_array_shared_by_two_tensors(rng):
    coords = mx.array(oracle.random_coords(rng, 60, low=0))
    n = coords.shape[0]
    fa = rng.standard_normal((n, 3)).astype(np.float32)
    fb = rng.standard_normal((n, 3)).astype(np.float32)
    a = ml.SparseTensor(coords, fa)
    b = ml.SparseTensor(coords, fb)
    assert b.coordinate_set is a.coordinate_set
    np.testing.assert_allclose(np.array(ml.add(a, b).feats), fa + fb, rtol=1e-6)


def test_registry_does_not_keep_managers_alive(rng):
    coords = mx.array(oracle.random_coords(rng, 30, low=0))
    t = ml.SparseTensor(coords, np.zeros((coords.shape[0], 1), np.float32))
    assert owner_of(coords)[0] is t.manager
    assert owner_of(mx.array(np.array(coords))) is None  # equal values, another array
    del t
    gc.collect()
    assert owner_of(coords) is None
    fresh = ml.SparseTensor(coords, np.zeros((coords.shape[0], 1), np.float32))
    assert fresh.manager.stats()["coordinate_sets"] == 1


# ------------------------------------------------ element-wise ops: modes
OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum}


@pytest.mark.parametrize("op", sorted(OPS))
def test_different_voxels_need_a_mode(rng, op):
    a, ca, fa = _tensor(rng, n=50, extent=5)
    b, cb, fb = _tensor(rng, n=50, extent=5)
    assert set(_keys(ca)) != set(_keys(cb))
    with pytest.raises(ValueError, match=f"{op}: a and b hold different voxels.*mode='union'.*mode='intersection'"):
        getattr(ml, op)(a, b)
    # a subset is a different voxel set too
    sub = ml.prune(a, np.arange(len(a)) % 2 == 0)
    with pytest.raises(ValueError, match="different voxels"):
        getattr(ml, op)(a, sub)
    # the explicit modes, against NumPy
    inter = getattr(ml, op)(a, b, mode="intersection")
    db = dict(zip(_keys(cb), fb))
    rows = [i for i, k in enumerate(_keys(ca)) if k in db]
    assert _keys(inter.coords) == [_keys(ca)[i] for i in rows]
    want = np.array([OPS[op](fa[i], db[_keys(ca)[i]]) for i in rows]).reshape(-1, 4)
    np.testing.assert_allclose(np.array(inter.feats), want, rtol=1e-6, atol=1e-6)
    union = getattr(ml, op)(a, b, mode="union")
    assert len(union) == len(set(_keys(ca)) | set(_keys(cb)))
    with pytest.raises(ValueError, match="mode must be None, 'union' or 'intersection'"):
        getattr(ml, op)(a, b, mode="outer")


@pytest.mark.parametrize("op", sorted(OPS))
def test_same_voxels_in_another_order_are_aligned(rng, op):
    a, ca, fa = _tensor(rng, n=60)
    perm = rng.permutation(len(ca))
    fb = rng.standard_normal(fa.shape).astype(np.float32)
    b = ml.SparseTensor(ca[perm], fb)  # the same voxels, another manager and order
    y = getattr(ml, op)(a, b)
    assert y.coordinate_set is a.coordinate_set
    fb_in_a_order = np.empty_like(fb)
    fb_in_a_order[perm] = fb
    np.testing.assert_allclose(np.array(y.feats), OPS[op](fa, fb_in_a_order), rtol=1e-6, atol=1e-6)
    # gradients reach b's rows through the alignment
    g = mx.grad(lambda v: ml.add(a, b.replace(v)).feats.sum())(b.feats)
    np.testing.assert_array_equal(np.array(g), np.ones_like(fb))


# ------------------------------------------------ batch size and empty items
def test_batch_counts_set_the_batch_size(rng):
    x0, coords, feats = _tensor(rng, n=80, batches=2)
    counts = np.bincount(coords[:, 0], minlength=2)
    x = ml.SparseTensor(coords, feats, batch_counts=[*counts, 0, 0])
    assert x.num_batches == 4 and x.batch_counts.tolist() == [*counts, 0, 0]
    assert x0.num_batches == 2  # the batch column alone
    b = coords[:, 0]
    mean = np.stack([feats[b == i].mean(0) for i in range(2)] + [np.zeros(4)] * 2)
    total = np.stack([feats[b == i].sum(0) for i in range(2)] + [np.zeros(4)] * 2)
    peak = np.stack([feats[b == i].max(0) for i in range(2)] + [np.zeros(4)] * 2)
    np.testing.assert_allclose(np.array(pooling.global_avg_pool(x)), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(pooling.global_sum_pool(x)), total, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.array(pooling.global_max_pool(x)), peak)  # empty items: 0
    np.testing.assert_array_equal(np.array(nn.GlobalMaxPool()(x)), peak)
    # gradient of the max: one row per non-empty item and channel, nothing for the empty ones
    g = mx.grad(lambda f: pooling.global_max_pool(x.replace(f)).sum())(x.feats)
    assert float(np.array(g).sum()) == 2 * 4
    # kept by what is computed from x
    w = mx.array(rng.standard_normal((3, 2, 2, 2, 4)).astype(np.float32))
    assert ops.conv3d(x, w, stride=2).num_batches == 4
    assert ops.subm_conv3d(x, mx.zeros((3, 3, 3, 3, 4))).num_batches == 4
    assert pooling.max_pool3d(x, 2).num_batches == 4
    assert ml.prune(x, np.arange(len(x)) % 2 == 0).num_batches == 4
    assert ml.to_dense(x).shape[0] == 4
    assert nn.InstanceNorm(4)(x).num_batches == 4
    assert ml.add(x, ml.prune(x, np.arange(len(x)) < 3), mode="union").num_batches == 4


def test_empty_scenes_and_empty_tensors_keep_their_rows(rng):
    a = oracle.random_coords(rng, 30, low=0)[:, 1:]
    fa = rng.standard_normal((len(a), 3)).astype(np.float32)
    empty = (np.zeros((0, 3), np.int32), np.zeros((0, 3), np.float32))
    batch = ml.sparse_collate([(a, fa), empty, empty])
    assert batch.num_batches == 3
    want = np.stack([fa.sum(0), np.zeros(3), np.zeros(3)])
    np.testing.assert_allclose(np.array(pooling.global_sum_pool(batch)), want, rtol=1e-5, atol=1e-5)
    none = ml.SparseTensor(np.zeros((0, 4), np.int32), np.zeros((0, 2), np.float32), batch_counts=[0, 0])
    for pool in (pooling.global_avg_pool, pooling.global_sum_pool, pooling.global_max_pool):
        np.testing.assert_array_equal(np.array(pool(none)), np.zeros((2, 2)))


def test_batch_counts_are_checked(rng):
    _, coords, feats = _tensor(rng, n=40, batches=2)
    counts = np.bincount(coords[:, 0], minlength=2)
    with pytest.raises(ValueError, match="do not match the batch column"):
        ml.SparseTensor(coords, feats, batch_counts=[counts[0] + counts[1], 0])
    with pytest.raises(ValueError, match="non-negative"):
        ml.SparseTensor(coords, feats, batch_counts=[*counts, -1])
    with pytest.raises(ValueError, match="1-D sequence of ints"):
        ml.SparseTensor(coords, feats, batch_counts=[[*counts]])


# ------------------------------------------------ half precision
def _adam_oracle(p0, grads, lr, b1=0.9, b2=0.999, eps=1e-8):
    """MLX Adam (no bias correction) in float64."""
    p = np.asarray(p0, np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for g in grads:
        g = np.asarray(g, np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr * m / (np.sqrt(v) + eps)
    return p


def test_mixed_precision_against_numpy(rng):
    p0 = rng.standard_normal((5, 7)).astype(np.float16)
    # gradients small enough that their squares underflow in float16
    grads = [(rng.standard_normal((5, 7)) * 1e-4).astype(np.float16) for _ in range(4)]
    params = {"w": mx.array(p0)}
    opt = optim.MixedPrecision(optim.Adam(learning_rate=1e-3))
    for g in grads:
        params = opt.apply_gradients({"w": mx.array(g)}, params)
    master = opt.state["master"]["w"]
    assert master.dtype == mx.float32 and params["w"].dtype == mx.float16
    want = _adam_oracle(p0.astype(np.float32), [g.astype(np.float32) for g in grads], 1e-3)
    np.testing.assert_allclose(np.array(master), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.array(params["w"]), np.array(master).astype(np.float16))
    # plain Adam on the float16 parameters: NaN, with one warning
    plain = {"w": mx.array(p0)}
    adam = optim.Adam(learning_rate=1e-3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for g in grads:
            plain = adam.apply_gradients({"w": mx.array(g)}, plain)
    assert [str(w.message) for w in caught if "float16" in str(w.message)][:1]
    assert sum("MixedPrecision" in str(w.message) for w in caught) == 1
    assert not np.isfinite(np.array(plain["w"])).all()


def _small_net():
    mx.random.seed(3)
    # (no bias before the batch norm: its gradient is zero up to rounding,
    # so Adam would move it by noise alone)
    return nn.Sequential(nn.SubmConv3d(4, 16, 3, bias=False), nn.BatchNorm(16), nn.ReLU(),
                         nn.SubmConv3d(16, 16, 3), nn.ReLU(), nn.Linear(16, 3))


def _train(rng_seed, dtype, wrap, steps=6):
    rng = np.random.default_rng(rng_seed)
    coords = oracle.random_coords(rng, 400, extent=12, low=0)
    x = ml.SparseTensor(coords, rng.standard_normal((len(coords), 4)).astype(np.float32)).astype(dtype)
    labels = mx.array(rng.integers(0, 3, len(coords)))
    model = _small_net()
    start = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    model.set_dtype(dtype)
    opt = optim.Adam(learning_rate=3e-3)
    if wrap:
        opt = optim.MixedPrecision(opt)

    def loss_fn(m):
        return mnn.losses.cross_entropy(m(x).feats.astype(mx.float32), labels, reduction="mean")

    step = mnn.value_and_grad(model, loss_fn)
    losses = []
    for _ in range(steps):
        loss, grads = step(model)
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state)
        losses.append(float(loss))
    final = opt.state["master"] if wrap else model.trainable_parameters()
    return losses, start, dict(tree_flatten(final))


def test_mixed_precision_small_model_matches_float32():
    ref_losses, start, ref = _train(21, mx.float32, wrap=False)
    losses, start16, master = _train(21, mx.float16, wrap=True)
    assert np.isfinite(losses).all()
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-2)
    assert losses[-1] < losses[0]
    # the float32 master weights travel as the float32 model's (Adam's
    # normalised steps amplify the float16 gradients' rounding somewhat)
    for k in ref:
        moved = (np.array(ref[k]) - start[k]).ravel()
        moved16 = (np.array(master[k]) - start[k]).ravel()
        assert np.linalg.norm(moved16 - moved) <= 0.2 * np.linalg.norm(moved), k
        assert moved16 @ moved >= 0.97 * np.linalg.norm(moved16) * np.linalg.norm(moved), k


def test_mixed_precision_state_round_trip_and_init():
    rng = np.random.default_rng(4)
    grads = [{"w": mx.array(rng.standard_normal(6).astype(np.float16))} for _ in range(4)]

    def opt_and_params():
        return optim.MixedPrecision(optim.Adam(learning_rate=1e-2)), {"w": mx.array(np.linspace(-1, 1, 6), mx.float16)}

    opt, p = opt_and_params()
    for g in grads:
        p = opt.apply_gradients(g, p)
    opt2, p2 = opt_and_params()
    for g in grads[:2]:
        p2 = opt2.apply_gradients(g, p2)
    saved = tree_flatten(opt2.state)
    opt3 = optim.MixedPrecision(optim.Adam(learning_rate=1e-2))
    opt3.state = tree_unflatten(saved)
    for g in grads[2:]:
        p2 = opt3.apply_gradients(g, p2)
    np.testing.assert_array_equal(np.array(opt3.state["master"]["w"]), np.array(opt.state["master"]["w"]))
    assert opt3.learning_rate.item() == pytest.approx(1e-2)
    # init copies weights loaded into the model in since
    loaded = {"w": mx.array(np.full(6, 0.5), mx.float16)}
    opt.init(loaded)
    np.testing.assert_array_equal(np.array(opt.state["master"]["w"]), np.full(6, 0.5, np.float32))
    with pytest.raises(TypeError, match="mlx.optimizers.Optimizer"):
        optim.MixedPrecision(lambda g: g)


# ------------------------------------------------ hints in errors
HINTS = {
    "features": ".feats", "F": ".feats", "indices": ".coords", "C": ".coords",
    "replace_feature": ".replace(feats)", "dense": "mlx_lattice.to_dense", "batch_size": ".num_batches",
    "ndim": "mlx_lattice.nn",
}


@pytest.mark.parametrize("name", sorted(HINTS))
def test_other_libraries_attribute_names(rng, name):
    x, _, _ = _tensor(rng, n=10)
    with pytest.raises(AttributeError, match=re.escape(HINTS[name])):
        getattr(x, name)
    assert not hasattr(x, name)


def test_unknown_attribute_is_a_plain_attribute_error(rng):
    x, _, _ = _tensor(rng, n=10)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'$"):
        x.nonsense


def test_sequential_names_an_mlx_nn_layer(rng):
    x, _, _ = _tensor(rng, n=30)
    with pytest.raises(TypeError, match=r"layers\[1\] \(ReLU\) is an mlx.nn layer.*mlx_lattice.nn.ReLU"):
        nn.Sequential(nn.SubmConv3d(4, 4, 3), mnn.ReLU())(x)
    with pytest.raises(TypeError, match=r"layers\[0\] \(Linear\).*mlx_lattice.nn.Linear"):
        nn.Sequential(mnn.Linear(4, 2))(x)
    with pytest.raises(TypeError, match=r"\(Mish\).*FeatureMap"):
        nn.Sequential(mnn.Mish())(x)
    # errors of our own layers pass through unchanged
    with pytest.raises(ValueError, match="BatchNorm\\(3\\) got features"):
        nn.Sequential(nn.BatchNorm(3))(x)
    # mlx.nn layers on arrays still work inside it
    assert nn.Sequential(nn.GlobalAvgPool(), mnn.Linear(4, 2))(x).shape == (1, 2)
    assert isinstance(nn.Sequential(), mnn.Sequential)


def test_dtype_errors_name_the_layer(rng):
    x, _, _ = _tensor(rng, n=40)
    model = MinkUNet(in_channels=4, num_classes=3, width=0.25)
    model.set_dtype(mx.float16)
    with pytest.raises(TypeError, match=r"SubmConv3d\(4, .*weight dtype float16 does not match the input "
                                        r"features' dtype float32.*set_dtype"):
        model(x)
    lin = nn.Linear(4, 2)
    with pytest.raises(TypeError, match=r"Linear\(input_dims=4, .*weight dtype float32.*float16"):
        lin(x.astype(mx.float16))
    with pytest.raises(TypeError, match=r"Conv3d\(4, 2, .*takes a SparseTensor, got array"):
        nn.Conv3d(4, 2, 3)(x.feats)


def test_manager_mismatch_suggests_coordinates(rng):
    x, coords, _ = _tensor(rng, n=40)
    t = ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32))  # another manager
    w = mx.zeros((2, 3, 3, 3, 4))
    with pytest.raises(ValueError, match=r"same CoordinateManager.*coordinates=t\.coords"):
        ops.conv3d(x, w, coordinates=t)
    y = ops.conv3d(x, w, coordinates=t.coords)  # the suggested call
    assert _keys(y.coords) == _keys(coords)


# ------------------------------------------------ the docs' code
def _blocks(page):
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S)


def _importable(names):
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  (any import failure: not usable here)
            return False
    return True


@pytest.mark.parametrize("page", ["spconv.md", "nn.md", "mixed_precision.md"])
def test_doc_code_blocks_run(page, tmp_path, monkeypatch, capsys):
    """Every python block of the page, in order, in one namespace; a block
    whose first line is ``# needs: a, b`` runs only where a and b import."""
    monkeypatch.chdir(tmp_path)
    blocks = _blocks(page)
    assert blocks
    namespace = {"__name__": f"docs_{page}"}
    ran = 0
    for i, code in enumerate(blocks):
        first = code.splitlines()[0]
        if first.startswith("# needs:"):
            needs = [n.strip() for n in first[len("# needs:"):].split(",")]
            if "spconv" in needs:
                needs.append("spconv.pytorch")
            if not _importable(needs):
                continue
        exec(compile(code, f"docs/{page} block {i}", "exec"), namespace)
        ran += 1
    assert ran >= 1
    capsys.readouterr()
