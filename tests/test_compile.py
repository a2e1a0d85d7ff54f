"""sparse_compile: mx.compile over SparseTensors, against the uncompiled
functions (themselves checked against the NumPy oracle elsewhere) and, for
a small network, the oracle itself."""

from functools import partial

import numpy as np
import pytest
import mlx.core as mx
import mlx.nn as mnn
from mlx.utils import tree_flatten

import mlx_lattice as ml
import mlx_lattice.optimizers as optim
from mlx_lattice import nn
from mlx_lattice.models import MinkUNet

import oracle


def _same(a, b):
    """Bitwise on the CPU; on a GPU MLX's fused element-wise kernels may
    round differently from the separate ones (docs/compile.md)."""
    a, b = np.array(a), np.array(b)
    if mx.default_device() == mx.cpu:
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _scene(rng, n=500, extent=14, c=4):
    coords = oracle.random_coords(rng, n, extent, 2)
    return ml.SparseTensor(coords, rng.standard_normal((len(coords), c)).astype(np.float32))


def test_compiled_network_matches_oracle(rng):
    mx.random.seed(1)
    model = nn.Sequential(nn.SubmConv3d(4, 8, 3), nn.ReLU(), nn.Conv3d(8, 6, 2, stride=2))
    x = _scene(rng, 200, 8)
    y = ml.sparse_compile(model)(x)
    coords, feats = np.array(x.coords), np.array(x.feats, np.float64)
    sub, down = model.layers[0], model.layers[2]
    h = np.maximum(oracle.apply(oracle.conv_edges(coords, coords, 3, 1, 1), feats, np.array(sub.weight, np.float64),
                                len(coords), np.array(sub.bias, np.float64)), 0)
    coarse = oracle.forward_support(coords, 2, 2)
    ref = oracle.apply(oracle.conv_edges(coords, coarse, 2, 2), h, np.array(down.weight, np.float64), len(coarse),
                       np.array(down.bias, np.float64))
    rows = oracle.match_rows(np.array(y.coords), coarse)
    np.testing.assert_allclose(np.array(y.feats)[rows], ref, rtol=1e-4, atol=1e-4)
    assert y.stride == (2, 2, 2)


def test_compiled_forward_equals_eager_and_retraces_for_new_coordinates(rng):
    mx.random.seed(2)
    model = MinkUNet(4, 3, width=0.25)
    model.eval()
    forward = ml.sparse_compile(model)
    x = _scene(rng)
    y = forward(x)
    eager = model(x)
    assert isinstance(y, ml.SparseTensor) and y.coordinate_set is eager.coordinate_set
    _same(y.feats, eager.feats)
    assert forward.traces == 1
    # new features on the same coordinates: the same trace
    x_b = x.replace(x.feats * 2 - 1)
    _same(forward(x_b).feats, model(x_b).feats)
    assert forward.traces == 1
    # other coordinates with as many rows: a new trace (a trace captured on
    # x's maps would run them on these features)
    coords = np.array(x.coords)
    other = coords.copy()
    other[:, 1:] = coords[:, [3, 1, 2]] * 2  # spread out: other neighbours, same row count
    x2 = ml.SparseTensor(other, x.feats)
    assert len(x2) == len(x)
    _same(forward(x2).feats, model(x2).feats)
    assert forward.traces == 2
    _same(forward(x).feats, eager.feats)
    assert forward.traces == 2
    # a bounded cache
    one = ml.sparse_compile(model, cache_size=1)
    for t in (x, x2, x):
        _same(one(t).feats, model(t).feats)
    assert one.traces == 3 and "traces=3" in repr(one)


def test_compiled_model_reads_its_current_weights(rng):
    """A compiled Module takes its parameters as state (inputs=model.state),
    not as constants of the first trace."""
    mx.random.seed(3)
    model = nn.Sequential(nn.SubmConv3d(4, 8, 3), nn.BatchNorm(8), nn.ReLU(), nn.Linear(8, 2))
    model.eval()
    x = _scene(rng, 300)
    forward = ml.sparse_compile(model)
    forward(x)
    model.layers[0].weight = model.layers[0].weight * 3
    model.layers[3].bias = model.layers[3].bias + 1
    _same(forward(x).feats, model(x).feats)
    # in training mode the batch norm's running statistics come back as
    # arrays, updated as the uncompiled calls update them
    mx.random.seed(3)
    eager = nn.Sequential(nn.SubmConv3d(4, 8, 3), nn.BatchNorm(8), nn.ReLU(), nn.Linear(8, 2))
    mx.random.seed(3)
    model = nn.Sequential(nn.SubmConv3d(4, 8, 3), nn.BatchNorm(8), nn.ReLU(), nn.Linear(8, 2))
    forward = ml.sparse_compile(model)
    for _ in range(3):
        _same(forward(x).feats, eager(x).feats)
    for name in ("running_mean", "running_var"):
        _same(getattr(model.layers[1], name), getattr(eager.layers[1], name))


def test_trees_keywords_and_constants(rng):
    x = _scene(rng, 300)
    w = mx.array(rng.standard_normal((5, 3, 3, 3, 4)).astype(np.float32))

    def fn(t, pair, *, scale, relu=False):
        y = ml.ops.subm_conv3d(t, pair[0]) 
        y = y.replace(mnn.relu(y.feats) if relu else y.feats * scale)
        return {"y": y, "sum": y.feats.sum(axis=0) + pair[1], "none": None}

    compiled = ml.sparse_compile(fn)
    bias = mx.ones((5,))
    for kw in (dict(scale=2.0), dict(scale=2.0, relu=True), dict(scale=3.0)):
        got, want = compiled(x, (w, bias), **kw), fn(x, (w, bias), **kw)
        assert got["none"] is None and got["y"].coordinate_set is x.coordinate_set
        _same(got["y"].feats, want["y"].feats)
        _same(got["sum"], want["sum"])
    assert compiled.traces == 3  # a constant is part of what a trace is for


@pytest.mark.parametrize("mixed", [False, True])
def test_compiled_training_step_equals_eager(rng, mixed):
    """Six steps of MinkUNet (batch norms in training mode, Adam) compiled
    with the model's and the optimizer's state as state, against the same
    steps uncompiled: losses, parameters, running statistics and moments."""
    x = _scene(rng)
    labels = mx.array(rng.integers(0, 3, len(x)))
    dtype = mx.float16 if mixed else mx.float32

    def build():
        mx.random.seed(4)
        model = MinkUNet(4, 3, width=0.25)
        model.set_dtype(dtype)
        opt = optim.Adam(learning_rate=1e-2)
        opt = optim.MixedPrecision(opt) if mixed else opt
        opt.init(model.trainable_parameters())  # the state exists before the trace
        return model, opt

    def loss_fn(m, t, labels):
        return mnn.losses.cross_entropy(m(t).feats.astype(mx.float32), labels, reduction="mean")

    eager_model, eager_opt = build()
    model, opt = build()
    state = [model.state, opt.state]

    @partial(ml.sparse_compile, inputs=state, outputs=state)
    def step(t, labels):
        loss, grads = mnn.value_and_grad(model, loss_fn)(model, t, labels)
        opt.update(model, grads)
        return loss

    xt = x.astype(dtype)
    for _ in range(6):
        loss, grads = mnn.value_and_grad(eager_model, loss_fn)(eager_model, xt, labels)
        eager_opt.update(eager_model, grads)
        mx.eval(eager_model.state, eager_opt.state)
        got = step(xt, labels)
        mx.eval(state)
        _same(got, loss)
    assert step.traces == 1
    for tree_a, tree_b in ((eager_model.parameters(), model.parameters()), (eager_opt.state, opt.state)):
        a, b = dict(tree_flatten(tree_a)), dict(tree_flatten(tree_b))
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k].astype(mx.float32), b[k].astype(mx.float32))


ERRORS = {
    "prune_by_logits": (lambda t: ml.prune_by_logits(t, t.feats[:, 0]), r"^sparse_compile: mlx_lattice.prune_by_logits cannot"),
    "nn.Prune": (lambda t: nn.Prune()(t, t.feats[:, 0]), r"mlx_lattice.prune_by_logits \(called by nn.Prune\) cannot"),
    "prune": (lambda t: ml.prune(t, t.feats[:, 0] > 0), r"mlx_lattice.prune cannot"),
    "top_k": (lambda t: ml.top_k(t, 10, t.feats[:, 0]), r"mlx_lattice.top_k cannot"),
    "coordinates": (lambda t: ml.SparseTensor(t.coords + (t.feats > 9).astype(mx.int32), t.feats),
                    r"SparseTensor\(\.\.\.\) cannot"),
    "voxelize": (lambda t: ml.voxelize(t.feats[:, :3] * 10, t.feats, 0.5)[0], r"mlx_lattice.voxelize cannot"),
    "item": (lambda t: t.replace(t.feats * t.feats.sum().item()), r"evaluates an array computed inside it"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_what_cannot_be_compiled_names_the_op(rng, case):
    fn, message = ERRORS[case]
    x = _scene(rng, 200)
    compiled = ml.sparse_compile(fn)
    with pytest.raises(ValueError, match=message):
        compiled(x)
    # the same function runs uncompiled
    assert isinstance(fn(x), ml.SparseTensor)


def test_building_maps_inside_is_fine_and_fixed_per_coordinate_set(rng):
    """Maps the trace builds from the inputs' coordinates (a strided
    convolution's output set, its relation) are built once, at the trace."""
    x = _scene(rng, 300)
    w = mx.array(rng.standard_normal((6, 2, 2, 2, 4)).astype(np.float32))
    fn = lambda t: ml.ops.conv3d(t, w, stride=2)  # noqa: E731
    compiled = ml.sparse_compile(fn)
    with ml.diagnostics.record(maps=True) as log:
        first = compiled(x)
        again = compiled(x.replace(x.feats + 1))
    assert sum(r["op"] == "map" for r in log) >= 1  # built at the trace
    assert sum(r["op"] != "map" for r in log) == 1  # one traced convolution, none on the second call
    _same(first.feats, fn(x).feats)
    _same(again.feats, fn(x.replace(x.feats + 1)).feats)
    assert again.coordinate_set is first.coordinate_set


def test_bad_arguments(rng):
    x = _scene(rng, 100)
    compiled = ml.sparse_compile(lambda t, extra=None: t)
    with pytest.raises(TypeError, match=r"argument\[1\] is a ndarray"):
        compiled(x, np.zeros(3))
    with pytest.raises(TypeError, match=r"keyword argument\['extra'\] is a object"):
        compiled(x, extra=object())
    with pytest.raises(TypeError, match="the result is a int"):
        ml.sparse_compile(lambda t: 3)(x)
    with pytest.raises(TypeError, match="fn must be callable"):
        ml.sparse_compile(3)
    with pytest.raises(ValueError, match="cache_size must be a positive int"):
        ml.sparse_compile(lambda t: t, cache_size=0)
    # plain mx.compile refuses a SparseTensor argument
    with pytest.raises(ValueError, match="trees of arrays"):
        mx.compile(lambda t: t.feats)(x)


def test_doc_code_blocks_run(tmp_path, monkeypatch):
    """docs/compile.md's python blocks, in order, in one namespace."""
    import re
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    text = (Path(__file__).resolve().parents[1] / "docs" / "compile.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    namespace = {"__name__": "docs_compile"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/compile.md block {i}", "exec"), namespace)
    assert namespace["step"].traces == 1 and namespace["forward"].traces == 1
