"""Reference networks: layout, batch independence, autodiff, compile,
weights round trip, the autoencoder, and a tiny run of the training example."""

import importlib.util
import pathlib
from functools import partial

import numpy as np
import pytest
import mlx.core as mx
import mlx.nn as mnn
import mlx.optimizers as optim
from mlx.utils import tree_flatten

import mlx_lattice as ml
from mlx_lattice import algebra, scenes
from mlx_lattice.models import MinkUNet, ResidualBlock, SparseVoxelAutoencoder

import oracle
from conftest import to_np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def blob(rng, n=400, extent=14, batches=1, c=4):
    coords = oracle.random_coords(rng, n, extent, batches)
    feats = rng.standard_normal((len(coords), c)).astype(np.float32)
    return ml.SparseTensor(coords, mx.array(feats)), coords, feats


def n_params(model):
    return sum(v.size for _, v in tree_flatten(model.trainable_parameters()))


def minkunet_param_count(c_in, n_cls, width):
    """Trainable parameters of the TorchSparse MinkUNet layout, by formula."""
    cs = [int(round(width * c)) for c in (32, 32, 64, 128, 256, 256, 128, 96, 96)]

    def block(i, o, k):
        return k**3 * i * o + 2 * o  # conv without bias + batch norm

    def res(i, o):
        return block(i, o, 3) + block(o, o, 3) + (block(i, o, 1) if i != o else 0)

    total = block(c_in, cs[0], 3) + block(cs[0], cs[0], 3)
    for i in range(4):
        total += block(cs[i], cs[i], 2) + res(cs[i], cs[i + 1]) + res(cs[i + 1], cs[i + 1])
    prev = cs[4]
    for j in range(4):
        out, skip = cs[5 + j], cs[3 - j]
        total += block(prev, out, 2) + res(out + skip, out) + res(out, out)
        prev = out
    return total + cs[8] * n_cls + n_cls


@pytest.mark.parametrize("width", [0.5, 1.0])
def test_minkunet_layout(width):
    model = MinkUNet(4, 19, width)
    assert model.channels == tuple(int(width * c) for c in (32, 32, 64, 128, 256, 256, 128, 96, 96))
    assert n_params(model) == minkunet_param_count(4, 19, width)
    if width == 1.0:
        assert round(n_params(model) / 1e6, 1) == 21.7  # the published 1.0x size


def test_minkunet_forward_support_and_batches(rng):
    model = MinkUNet(4, 3, width=0.25)
    model.eval()
    a, ca, fa = blob(rng)
    b, cb, fb = blob(rng, n=300)
    y = model(a)
    assert y.coordinate_set is a.coordinate_set and y.feats.shape == (len(ca), 3)
    # two scenes in one batch give the same logits as each scene alone
    both = algebra.sparse_collate([a, b])
    yb = np.array(model(both).feats)
    np.testing.assert_allclose(yb[: len(ca)], np.array(y.feats), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(yb[len(ca):], np.array(model(b).feats), rtol=1e-4, atol=1e-4)
    # relations are built once per geometry and reused
    stats = a.manager.stats()
    assert stats["hits"] > stats["builds"]


def test_residual_block_against_oracle(rng):
    x, coords, feats = blob(rng, n=150, extent=6, c=3)
    block = ResidualBlock(3, 5)
    block.eval()
    y = to_np(block(x).feats)
    edges = oracle.conv_edges(coords, coords, 3, 1, 1)

    def bn(v, m):
        return (v - np.array(m.running_mean)) / np.sqrt(np.array(m.running_var) + m.eps) * np.array(m.weight) + np.array(m.bias)

    h = np.maximum(bn(oracle.apply(edges, feats, np.array(block.conv1.weight), len(coords)), block.norm1), 0)
    h = bn(oracle.apply(edges, h, np.array(block.conv2.weight), len(coords)), block.norm2)
    lin, norm = block.shortcut.layers
    s = bn(feats @ np.array(lin.weight, np.float64).T, norm)
    np.testing.assert_allclose(y, np.maximum(h + s, 0), rtol=1e-4, atol=1e-4)


def test_minkunet_gradients_and_compile(rng):
    model = MinkUNet(4, 3, width=0.25)
    x, coords, feats = blob(rng)
    labels = mx.array(rng.integers(0, 3, len(coords)).astype(np.int32))

    def loss_fn(m, feats):
        return mnn.losses.cross_entropy(m(x.replace(feats)).feats, labels, reduction="mean")

    loss, grads = mnn.value_and_grad(model, loss_fn)(model, x.feats)
    flat = tree_flatten(grads)
    assert len(flat) == len(tree_flatten(model.trainable_parameters()))
    assert all(np.isfinite(np.array(g)).all() for _, g in flat)
    assert sum(float(mx.abs(g).sum()) > 0 for _, g in flat) == len(flat)

    # mx.compile of the forward pass (eval mode) matches eager
    model.eval()
    forward = mx.compile(lambda f: model(x.replace(f)).feats)
    eager = model(x).feats
    np.testing.assert_allclose(np.array(forward(x.feats)), np.array(eager), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(forward(x.feats * 2)), np.array(model(x.replace(x.feats * 2)).feats),
                               rtol=1e-5, atol=1e-5)

    # a compiled training step (batch-norm statistics and optimizer state as state)
    model.train()
    opt = optim.Adam(learning_rate=1e-2)
    state = [model.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(f):
        loss, g = mnn.value_and_grad(model, loss_fn)(model, f)
        opt.update(model, g)
        return loss

    losses = []
    for _ in range(6):
        losses.append(float(step(x.feats)))
        mx.eval(state)
    assert losses[-1] < losses[0]


def test_minkunet_weights_round_trip(rng, tmp_path):
    x, _, _ = blob(rng)
    model = MinkUNet(4, 3, width=0.25)
    model(x)  # training mode: moves the running statistics
    model.eval()
    y = np.array(model(x).feats)
    path = str(tmp_path / "minkunet.safetensors")
    model.save_weights(path)
    other = MinkUNet(4, 3, width=0.25)
    other.load_weights(path)
    other.eval()
    np.testing.assert_array_equal(np.array(other(x).feats), y)


def test_autoencoder_teacher_forcing_and_training():
    mx.random.seed(0)
    v, f = scenes.procedural_closed_mesh(subdiv=3)
    coords = scenes.surface_voxels(v, f, resolution=20)
    x = ml.SparseTensor(coords, mx.ones((len(coords), 1)))
    model = SparseVoxelAutoencoder(1, channels=(8, 16, 16), latent_channels=4)
    z = model.encode(x)
    assert z.stride == (4, 4, 4)
    recon, levels = model(x)
    assert len(levels) == 2
    # teacher forcing: every encoder voxel is proposed and kept at each level
    assert np.array_equal(np.sort(np.array(recon.coords), axis=0), np.sort(coords, axis=0))
    assert set(map(tuple, np.array(recon.coords).tolist())) == set(map(tuple, coords.tolist()))
    fine = len(coords)
    assert levels[-1].target.sum() == fine and levels[-1].logits.feats.shape[1] == 1
    # the decoder grows 8 children per kept voxel
    assert len(levels[-1].logits) == 8 * len(oracle.forward_support(coords, 2, 2))
    opt = optim.Adam(learning_rate=1e-2)
    step = mnn.value_and_grad(model, lambda m: m.loss(x))
    losses = []
    for _ in range(12):
        loss, g = step(model)
        opt.update(model, g)
        mx.eval(loss, model.parameters(), opt.state)
        losses.append(float(loss))
    assert losses[-1] < 0.7 * losses[0]
    model.eval()
    out = model.reconstruct(x)
    assert isinstance(out, ml.SparseTensor) and out.stride == (1, 1, 1)


def test_autoencoder_doc_example_runs(capsys):
    """The SparseVoxelAutoencoder example of docs/decoder.md, run as written
    (it asserts the latent stride, teacher forcing and a falling loss)."""
    import re

    page = (ROOT / "docs" / "decoder.md").read_text()
    section = page.split("## A complete model: `models.SparseVoxelAutoencoder`")[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1 and "SparseVoxelAutoencoder(" in blocks[0]
    namespace = {"__name__": "docs_decoder_autoencoder"}
    exec(compile(blocks[0], "docs/decoder.md (autoencoder)", "exec"), namespace)
    assert isinstance(namespace["predicted"], ml.SparseTensor)
    capsys.readouterr()


def load_example():
    spec = importlib.util.spec_from_file_location("train_segmentation", ROOT / "examples" / "train_segmentation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_training_example_loss_falls():
    ex = load_example()
    out = ex.train(steps=10, voxel_size=0.4, width=0.25, train_scenes=(1, 2), eval_scene=0,
                   max_range=15.0, learning_rate=5e-3, log_every=0, log=lambda *a: None)
    losses = out["losses"]
    assert len(losses) == 10 and all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:2])
    assert 0.0 <= out["eval_after"]["accuracy"] <= 1.0
