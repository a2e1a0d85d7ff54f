"""Checkpoint converters against each library's documented convolution,
written here from the libraries' definitions (offset lists, weight layouts,
coordinate columns), and against the dense oracle."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import mlx.core as mx
import mlx.nn as mnn

from mlx_lattice import SparseTensor, convert, nn, ops
from mlx_lattice.__main__ import main
from mlx_lattice.models.minkunet import MinkUNet

import oracle


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ----------------------------------------------- the libraries' definitions
def torchsparse_offsets(sizes):
    """TorchSparse: per axis arange(-K//2 + 1, K//2 + 1); the list runs with
    axis 0 fastest when the kernel volume is odd, axis 2 fastest when even."""
    per = [list(range(-k // 2 + 1, k // 2 + 1)) for k in sizes]
    if math.prod(sizes) % 2 == 1:
        return [(a, b, c) for c in per[2] for b in per[1] for a in per[0]]
    return [(a, b, c) for a in per[0] for b in per[1] for c in per[2]]


def minkowski_offsets(sizes):
    """MinkowskiEngine hyper-cube region: odd K spans [-K//2, K//2], even K
    spans [0, K - 1]; the iterator advances axis 0 first."""
    per = [list(range(0, k)) if k % 2 == 0 else list(range(-(k // 2), k // 2 + 1)) for k in sizes]
    return [(a, b, c) for c in per[2] for b in per[1] for a in per[0]]


def table_conv(src_coords, feats, kernel, offs, out_coords, scale=1):
    """y[q] = sum_k x[q * scale + off_k] @ kernel[k] in the source's own
    coordinates (TorchSparse / MinkowskiEngine convolution)."""
    idx = {tuple(c): i for i, c in enumerate(np.asarray(src_coords).tolist())}
    y = np.zeros((len(out_coords), kernel.shape[-1]))
    for o, q in enumerate(np.asarray(out_coords).tolist()):
        for k, off in enumerate(offs):
            src = (q[0],) + tuple(q[1 + a] * scale + off[a] for a in range(3))
            if src in idx:
                y[o] += feats[idx[src]].astype(np.float64) @ kernel[k]
    return y


def table_conv_transpose(src_coords, feats, kernel, offs, out_coords, scale=1):
    """Transposed: y[p * scale + off_k] += x[p] @ kernel[k] (the forward map
    traversed backwards), read at out_coords."""
    idx = {tuple(c): i for i, c in enumerate(np.asarray(out_coords).tolist())}
    y = np.zeros((len(out_coords), kernel.shape[-1]))
    for i, p in enumerate(np.asarray(src_coords).tolist()):
        for k, off in enumerate(offs):
            dst = (p[0],) + tuple(p[1 + a] * scale + off[a] for a in range(3))
            if dst in idx:
                y[idx[dst]] += feats[i].astype(np.float64) @ kernel[k]
    return y


def spconv_conv(src_coords, feats, weight_krsc, out_coords, stride, padding):
    """spconv: y[q] = sum_d W[:, d0, d1, d2, :] x[s q - p + d] over the
    source's index columns."""
    idx = {tuple(c): i for i, c in enumerate(np.asarray(src_coords).tolist())}
    w = weight_krsc.astype(np.float64)
    y = np.zeros((len(out_coords), w.shape[0]))
    for o, q in enumerate(np.asarray(out_coords).tolist()):
        for d in itertools.product(*(range(k) for k in w.shape[1:4])):
            src = (q[0],) + tuple(stride * q[1 + a] - padding + d[a] for a in range(3))
            if src in idx:
                y[o] += w[:, d[0], d[1], d[2], :] @ feats[idx[src]]
    return y


def _ours(coords, axes="xyz", batch="first"):
    return np.asarray(convert.source_coordinates(coords, batch=batch, axes=axes))


def _check(actual, expected, tol=1e-4):
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), expected, rtol=tol, atol=tol)


# ------------------------------------------------------------- submanifold
@pytest.mark.parametrize("sizes", [(3, 3, 3), (2, 2, 2), (3, 1, 3), (1, 3, 5)])
@pytest.mark.parametrize("axes", ["xyz", "zyx"])
def test_torchsparse_submanifold(sizes, axes):
    rng = np.random.default_rng(1)
    src = oracle.random_coords(rng, 40, extent=5, batches=2)
    feats = _rand(rng, len(src), 5)
    kernel = _rand(rng, math.prod(sizes), 5, 7)
    expected = table_conv(src, feats, kernel, torchsparse_offsets(sizes), src)
    ours_sizes = tuple(sizes[axes.index(c)] for c in "xyz")
    model = nn.SubmConv3d(5, 7, ours_sizes, bias=False)
    convert.from_torchsparse({"conv.kernel": kernel}, model, axes=axes)
    coords = _ours(src, axes)
    y = model(SparseTensor(mx.array(coords), mx.array(feats)))
    _check(y.feats, expected)
    ref = oracle.dense_conv(coords, feats, np.asarray(model.weight), coords,
                            padding=oracle.subm_padding(ours_sizes))
    _check(ref, expected)


@pytest.mark.parametrize("sizes", [(3, 3, 3), (2, 2, 2), (3, 2, 1)])
@pytest.mark.parametrize("axes", ["xyz", "yzx"])
def test_minkowski_submanifold(sizes, axes):
    rng = np.random.default_rng(2)
    src = oracle.random_coords(rng, 40, extent=5, batches=2)
    feats = _rand(rng, len(src), 4)
    kernel = _rand(rng, math.prod(sizes), 4, 6)
    bias = _rand(rng, 6)
    expected = table_conv(src, feats, kernel, minkowski_offsets(sizes), src) + bias
    ours_sizes = tuple(sizes[axes.index(c)] for c in "xyz")
    flat = convert.from_minkowski({"c.kernel": kernel, "c.bias": bias}, None, axes=axes) if len(
        set(sizes)) == 1 else None
    model = nn.Conv3d(4, 6, ours_sizes)
    convert.from_minkowski({"c.kernel": kernel, "c.bias": bias}, model, axes=axes)
    if flat is not None:
        np.testing.assert_array_equal(np.asarray(flat["c.weight"]), np.asarray(model.weight))
    # MinkowskiEngine centres odd axes and starts even axes at 0.
    pad = tuple(k // 2 if k % 2 else 0 for k in ours_sizes)
    coords = _ours(src, axes)
    x = SparseTensor(mx.array(coords), mx.array(feats))
    y = ops.conv3d(x, model.weight, model.bias, padding=pad, coordinates=mx.array(coords))
    _check(y.feats, expected)
    ref = oracle.dense_conv(coords, feats, np.asarray(model.weight), coords, padding=pad) + bias
    _check(ref, expected)


@pytest.mark.parametrize("layout", convert.SPCONV_LAYOUTS)
def test_spconv_strided_zyx(layout):
    """spconv fed (batch, z, y, x) indices, as detection models do."""
    rng = np.random.default_rng(3)
    src = oracle.random_coords(rng, 50, extent=8, batches=2, low=0)
    feats = _rand(rng, len(src), 3)
    w = _rand(rng, 4, 3, 2, 1, 3)  # (C_out, Kz, Ky, Kx, C_in) over the source columns
    stored = {"KRSC": w, "RSCK": w.transpose(1, 2, 3, 4, 0), "RSKC": w.transpose(1, 2, 3, 0, 4)}[layout]
    out_src = oracle.forward_support(src, (3, 2, 1), stride=2, padding=1)
    expected = spconv_conv(src, feats, w, out_src, stride=2, padding=1)
    model = nn.Conv3d(3, 4, (1, 2, 3), stride=2, padding=1, bias=False)
    convert.from_spconv({"net.0.weight": stored}, model, axes="zyx", layout=layout)
    assert model.weight.shape == (4, 1, 2, 3, 3)
    x = SparseTensor(mx.array(_ours(src, "zyx")), mx.array(feats))
    y = model(x, coordinates=mx.array(_ours(out_src, "zyx")))
    _check(y.feats, expected)


def test_spconv_submanifold_matches_oracle():
    rng = np.random.default_rng(4)
    src = oracle.random_coords(rng, 40, extent=5)
    feats = _rand(rng, len(src), 6)
    w = _rand(rng, 5, 3, 3, 3, 6)
    flat = convert.from_spconv({"subm.weight": w})
    np.testing.assert_array_equal(np.asarray(flat["subm.weight"]), w)
    expected = spconv_conv(src, feats, w, src, stride=1, padding=1)
    y = ops.subm_conv3d(SparseTensor(mx.array(src.astype(np.int32)), mx.array(feats)), flat["subm.weight"])
    _check(y.feats, expected)


@pytest.mark.parametrize("which", ["torchsparse", "minkowski"])
def test_transposed_onto_recorded_voxels(which):
    """A 2x2x2 stride-2 transposed convolution (U-Net decoders)."""
    rng = np.random.default_rng(5)
    fine = oracle.random_coords(rng, 60, extent=8, batches=2, low=0)
    coarse = np.unique(np.concatenate([fine[:, :1], fine[:, 1:] // 2], 1), axis=0)
    feats = _rand(rng, len(coarse), 4)
    kernel = _rand(rng, 8, 4, 3)
    offs = (torchsparse_offsets if which == "torchsparse" else minkowski_offsets)((2, 2, 2))
    expected = table_conv_transpose(coarse, feats, kernel, offs, fine, scale=2)
    model = nn.ConvTranspose3d(4, 3, 2, stride=2, bias=False)
    convert.SOURCES[which]({"up.kernel": kernel}, model)
    y = model(SparseTensor(mx.array(coarse.astype(np.int32)), mx.array(feats)),
              coordinates=mx.array(fine.astype(np.int32)))
    _check(y.feats, expected)
    ref = oracle.dense_conv_transpose(coarse, feats, np.asarray(model.weight), fine, stride=2)
    _check(ref, expected)


def test_torchsparse_strided_3x3x3():
    rng = np.random.default_rng(6)
    fine = oracle.random_coords(rng, 60, extent=8, low=0)
    coarse = np.unique(np.concatenate([fine[:, :1], fine[:, 1:] // 2], 1), axis=0)
    feats = _rand(rng, len(fine), 3)
    kernel = _rand(rng, 27, 3, 2)
    expected = table_conv(fine, feats, kernel, torchsparse_offsets((3, 3, 3)), coarse, scale=2)
    flat = convert.from_torchsparse({"down.kernel": kernel})
    x = SparseTensor(mx.array(fine.astype(np.int32)), mx.array(feats))
    y = ops.conv3d(x, flat["down.weight"], stride=2, padding=1, coordinates=mx.array(coarse.astype(np.int32)))
    _check(y.feats, expected)


# ---------------------------------------------------------- whole models
def _to_torchsparse(model):
    """Our MinkUNet's parameters as a TorchSparse state dict (the inverse
    mapping, from the offset list above)."""
    sd = {}
    for path, m in convert._walk(model):
        if isinstance(m, nn.BatchNorm):
            for k in ("weight", "bias", "running_mean", "running_var"):
                sd[f"{path}.{k}"] = np.asarray(m[k])
            sd[f"{path}.num_batches_tracked"] = np.array(3)
        elif isinstance(m, nn.Linear):
            sd[f"{path}.weight"] = np.asarray(m.weight)
            if "bias" in m:
                sd[f"{path}.bias"] = np.asarray(m.bias)
        elif hasattr(m, "kernel_size") and "weight" in m and m.weight.ndim == 5:
            w = np.asarray(m.weight)
            ks = w.shape[1:4]
            lo = [-((k - 1) // 2) for k in ks]
            sd[f"{path}.kernel"] = np.stack(
                [w[:, o[0] - lo[0], o[1] - lo[1], o[2] - lo[2], :].T for o in torchsparse_offsets(ks)])
    return sd


def test_minkunet_round_trip():
    mx.random.seed(0)
    src = MinkUNet(in_channels=4, num_classes=5, width=0.25)
    for _, m in convert._walk(src):  # non-trivial running statistics
        if isinstance(m, nn.BatchNorm):
            m.running_mean = mx.random.normal(m.running_mean.shape)
            m.running_var = mx.random.uniform(0.5, 2.0, m.running_var.shape)
    sd = _to_torchsparse(src)
    dst = convert.from_torchsparse(sd, MinkUNet(in_channels=4, num_classes=5, width=0.25))
    from mlx.utils import tree_flatten
    a, b = dict(tree_flatten(src.parameters())), dict(tree_flatten(dst.parameters()))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def test_sequential_mixed_units_and_dtype():
    rng = np.random.default_rng(7)
    sd = {
        "0.kernel": _rand(rng, 27, 3, 8), "0.bias": _rand(rng, 8),
        "1.bn.weight": _rand(rng, 8), "1.bn.bias": _rand(rng, 8),
        "1.bn.running_mean": _rand(rng, 8), "1.bn.running_var": np.ones(8, np.float32),
        "2.kernel": _rand(rng, 8, 4),  # 1x1x1 convolution -> our Linear
        "3.linear.weight": _rand(rng, 2, 4), "3.linear.bias": _rand(rng, 2),  # -> our 1x1x1 conv
    }
    model = mnn.Sequential(nn.SubmConv3d(3, 8, 3), nn.BatchNorm(8), nn.Linear(8, 4, bias=False),
                           nn.Conv3d(4, 2, 1))
    model.set_dtype(mx.float16)
    convert.from_minkowski(sd, model)
    layers = model.layers
    assert layers[0].weight.dtype == mx.float16
    np.testing.assert_array_equal(np.asarray(layers[1].running_mean), sd["1.bn.running_mean"].astype(np.float16))
    np.testing.assert_array_equal(np.asarray(layers[2].weight), sd["2.kernel"].T.astype(np.float16))
    np.testing.assert_array_equal(np.asarray(layers[3].weight).reshape(2, 4), sd["3.linear.weight"].astype(np.float16))


# ------------------------------------------------------------------ errors
def test_mismatch_errors_name_both_sides():
    rng = np.random.default_rng(8)
    conv = {"a.kernel": _rand(rng, 27, 3, 8)}
    bn = {f"b.{k}": np.ones(8, np.float32) for k in ("weight", "bias", "running_mean", "running_var")}
    with pytest.raises(ValueError, match=r"source 'a'.*model 'layers.0'.*channels"):
        convert.from_torchsparse(conv, mnn.Sequential(nn.SubmConv3d(4, 8, 3, bias=False)))
    with pytest.raises(ValueError, match=r"source 'a'.*model 'layers.0'.*kernel offsets"):
        convert.from_torchsparse(conv, mnn.Sequential(nn.SubmConv3d(3, 8, 5, bias=False)))
    with pytest.raises(ValueError, match=r"source 'b' \(batch norm.*model 'layers.0'.*Conv"):
        convert.from_torchsparse(bn, mnn.Sequential(nn.SubmConv3d(3, 8, 3, bias=False)))
    with pytest.raises(ValueError, match=r"1 convolution.*model 2.*model 'layers.1' \(BatchNorm"):
        convert.from_torchsparse(conv, mnn.Sequential(nn.SubmConv3d(3, 8, 3, bias=False), nn.BatchNorm(8)))
    with pytest.raises(ValueError, match=r"source has 2 .* model 1.*source 'b'"):
        convert.from_torchsparse({**conv, **bn}, mnn.Sequential(nn.SubmConv3d(3, 8, 3, bias=False)))
    with pytest.raises(ValueError, match="model has a bias and the source none"):
        convert.from_torchsparse(conv, mnn.Sequential(nn.SubmConv3d(3, 8, 3)))
    with pytest.raises(ValueError, match="BatchNorm, 4 features"):
        convert.from_torchsparse(bn, mnn.Sequential(nn.BatchNorm(4)))


def test_bad_arguments():
    rng = np.random.default_rng(9)
    with pytest.raises(ValueError, match="axes must be a permutation"):
        convert.from_spconv({"c.weight": _rand(rng, 2, 3, 3, 3, 2)}, axes="xxz")
    with pytest.raises(ValueError, match="layout must be one of"):
        convert.from_spconv({}, layout="NCHW")
    with pytest.raises(TypeError, match="state_dict must be a dict"):
        convert.from_minkowski([1, 2])
    with pytest.raises(TypeError, match="model must be an mlx.nn.Module"):
        convert.from_minkowski({}, model=3)
    with pytest.raises(ValueError, match="not a cube; pass a model"):
        convert.from_torchsparse({"c.kernel": _rand(rng, 9, 2, 2)})
    with pytest.raises(ValueError, match=r"source 'ln'.*not a convolution"):
        convert.from_spconv({"ln.weight": np.ones(4, np.float32), "ln.bias": np.ones(4, np.float32)})
    with pytest.raises(ValueError, match="batch norm needs"):
        convert.from_spconv({"bn.running_mean": np.ones(4, np.float32)})
    with pytest.raises(TypeError, match="'c.kernel' must be a tensor"):
        convert.from_minkowski({"c.kernel": [1.0]})
    with pytest.raises(ValueError, match="coords must be an"):
        convert.source_coordinates(np.zeros((3, 3), np.int32))
    with pytest.raises(ValueError, match="batch must be"):
        convert.source_coordinates(np.zeros((3, 4), np.int32), batch="middle")


def test_source_coordinates():
    c = np.array([[1, 2, 3, 0], [4, 5, 6, 1]])
    np.testing.assert_array_equal(np.asarray(convert.source_coordinates(c, batch="last")), [[0, 1, 2, 3], [1, 4, 5, 6]])
    np.testing.assert_array_equal(np.asarray(convert.source_coordinates(c, axes="zyx")), [[1, 0, 3, 2], [4, 1, 6, 5]])


def test_empty_state_dict():
    assert convert.from_spconv({}) == {}
    with pytest.raises(ValueError, match="source has 0 .* model 1"):
        convert.from_spconv({}, mnn.Sequential(nn.BatchNorm(3)))


# --------------------------------------------------------------- files / CLI
def test_cli_safetensors_in_any_extension(tmp_path):
    rng = np.random.default_rng(10)
    w = _rand(rng, 5, 3, 3, 3, 2)
    path = tmp_path / "model.pth"  # a safetensors file under a .pth name: read without torch
    mx.save_safetensors(str(tmp_path / "st.safetensors"), {"blocks.10.weight": mx.array(w),
                                                           "blocks.2.weight": mx.array(w[:, ::-1].copy())})
    (tmp_path / "st.safetensors").rename(path)
    out = tmp_path / "out.safetensors"
    assert main(["convert", "--from", "spconv", "--axes", "zyx", str(path), str(out)]) == 0
    got = mx.load(str(out))
    np.testing.assert_array_equal(np.asarray(got["blocks.10.weight"]), w.transpose(0, 3, 2, 1, 4))
    assert list(convert.load_state_dict(path)) == ["blocks.2.weight", "blocks.10.weight"]
    assert main(["convert", "--from", "spconv", "--prefix", "blocks.2.", str(path), str(out)]) == 0
    assert list(mx.load(str(out))) == ["blocks.2.weight"]
    with pytest.raises(SystemExit):  # argparse error: message, no traceback
        main(["convert", "--from", "spconv", "--axes", "xy", str(path), str(out)])


class _NamedNet(mnn.Module):
    """Layers whose definition order is not the sorted order of their names."""

    def __init__(self):
        super().__init__()
        self.stem = nn.SubmConv3d(4, 6, 3)
        self.bn = nn.BatchNorm(6)
        self.down = nn.Conv3d(6, 8, (1, 2, 3), stride=2, bias=False)
        self.head = nn.Linear(8, 3)


def _spconv_named_state_dict(rng):
    """An spconv-style state dict for _NamedNet fed (batch, z, y, x) indices:
    weights (C_out, Kz, Ky, Kx, C_in), names that sort in another order."""
    return {
        "conv_input.0.weight": _rand(rng, 6, 3, 3, 3, 4), "conv_input.0.bias": _rand(rng, 6),
        "conv_input.1.weight": _rand(rng, 6), "conv_input.1.bias": _rand(rng, 6),
        "conv_input.1.running_mean": _rand(rng, 6),
        "conv_input.1.running_var": rng.uniform(0.5, 2, 6).astype(np.float32),
        "conv_input.1.num_batches_tracked": np.array(5),
        "conv2.0.weight": _rand(rng, 8, 3, 2, 1, 6),
        "cls_head.weight": _rand(rng, 3, 8), "cls_head.bias": _rand(rng, 3),
    }


def _check_named_net(model, sd):
    """The loaded parameters against the source, mapped here with NumPy."""
    zyx = (0, 3, 2, 1, 4)  # (C_out, Kz, Ky, Kx, C_in) -> (C_out, Kx, Ky, Kz, C_in)
    expected = {
        "stem.weight": sd["conv_input.0.weight"].transpose(zyx), "stem.bias": sd["conv_input.0.bias"],
        "bn.weight": sd["conv_input.1.weight"], "bn.bias": sd["conv_input.1.bias"],
        "bn.running_mean": sd["conv_input.1.running_mean"], "bn.running_var": sd["conv_input.1.running_var"],
        "down.weight": sd["conv2.0.weight"].transpose(zyx),
        "head.weight": sd["cls_head.weight"], "head.bias": sd["cls_head.bias"],
    }
    from mlx.utils import tree_flatten
    got = dict(tree_flatten(model.parameters()))
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        np.testing.assert_array_equal(np.asarray(got[k]), v, err_msg=k)


def test_cli_output_loads_in_one_call(tmp_path, monkeypatch):
    rng = np.random.default_rng(14)
    sd = _spconv_named_state_dict(rng)
    # The CLI reads a torch checkpoint (module order kept); stand in for it
    # without torch.
    monkeypatch.setattr(convert, "load_state_dict", lambda path: dict(sd))
    out = tmp_path / "out.safetensors"
    assert main(["convert", "--from", "spconv", "--axes", "zyx", "ckpt.pth", str(out)]) == 0
    monkeypatch.undo()
    model = convert.load_converted(out, _NamedNet())
    _check_named_net(model, sd)
    # the source order comes back, though the file stores keys sorted
    modules = ["conv_input.0", "conv_input.1", "conv2.0", "cls_head"]
    order = list(dict.fromkeys(k.rpartition(".")[0] for k in convert.load_converted(out)))
    assert order == modules
    assert list(dict.fromkeys(k.rpartition(".")[0] for k in convert.load_state_dict(out))) == modules
    # the same as converting the state dict directly with the model
    direct = convert.from_spconv(sd, _NamedNet(), axes="zyx")
    _check_named_net(direct, sd)
    # the loaded stem on (batch, z, y, x) indices against spconv's definition
    src = oracle.random_coords(rng, 40, extent=6, batches=2, low=0).astype(np.int32)
    feats = _rand(rng, len(src), 4)
    expected = spconv_conv(src, feats, sd["conv_input.0.weight"], src, stride=1, padding=1)
    y = model.stem(SparseTensor(mx.array(_ours(src, "zyx")), mx.array(feats)))
    _check(y.feats, expected + sd["conv_input.0.bias"])


def test_save_converted_every_source(tmp_path):
    rng = np.random.default_rng(15)
    kernel = _rand(rng, 27, 3, 5)
    for source, sd in (("torchsparse", {"b.conv.kernel": kernel}), ("minkowski", {"b.conv.kernel": kernel}),
                       ("spconv", {"b.conv.weight": _rand(rng, 5, 3, 3, 3, 3)})):
        path = tmp_path / f"{source}.safetensors"
        assert convert.save_converted(sd, path, source=source) == 1
        model = mnn.Sequential(nn.SubmConv3d(3, 5, 3, bias=False))
        convert.load_converted(path, model)
        want = convert.SOURCES[source](sd)["b.conv.weight"]
        np.testing.assert_array_equal(np.asarray(model.layers[0].weight), np.asarray(want))
    with pytest.raises(ValueError, match="source must be one of"):
        convert.save_converted({}, tmp_path / "x.safetensors", source="spconv2")


def test_load_converted_errors(tmp_path):
    with pytest.raises(ValueError, match="path: no such file"):
        convert.load_converted(tmp_path / "missing.safetensors", mnn.Sequential())
    plain = tmp_path / "plain.safetensors"
    mx.save_safetensors(str(plain), {"conv.weight": mx.zeros((2, 1, 1, 1, 2))})
    with pytest.raises(ValueError, match="not written by `python -m mlx_lattice convert`"):
        convert.load_converted(plain, mnn.Sequential(nn.Linear(2, 2)))
    sd = {"a.weight": _rand(np.random.default_rng(16), 4, 3)}
    out = tmp_path / "out.safetensors"
    convert.save_converted(sd, out, source="spconv")
    with pytest.raises(ValueError, match="does not match"):
        convert.load_converted(out, mnn.Sequential(nn.Linear(4, 3)))


def test_torch_checkpoint_cli_to_model(tmp_path):
    torch = pytest.importorskip("torch")
    sd = _spconv_named_state_dict(np.random.default_rng(17))
    torch.save({"state_dict": {k: torch.from_numpy(np.asarray(v)) for k, v in sd.items()}}, tmp_path / "ckpt.pth")
    out = tmp_path / "out.safetensors"
    assert main(["convert", "--from", "spconv", "--axes", "zyx", str(tmp_path / "ckpt.pth"), str(out)]) == 0
    _check_named_net(convert.load_converted(out, _NamedNet()), sd)


def test_load_errors(tmp_path):
    with pytest.raises(ValueError, match="path: no such file"):
        convert.load_state_dict(tmp_path / "missing.pth")
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint at all")
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="needs torch installed"):
            convert.load_state_dict(junk)
    else:
        with pytest.raises(ValueError, match="could not be read as a torch checkpoint"):
            convert.load_state_dict(junk)


def test_torch_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    sd = {"conv.weight": torch.from_numpy(_rand(rng, 4, 3, 3, 3, 2)).to(torch.bfloat16),
          "bn.weight": torch.ones(4), "bn.bias": torch.zeros(4), "bn.running_mean": torch.zeros(4),
          "bn.running_var": torch.ones(4), "bn.num_batches_tracked": torch.tensor(7)}
    torch.save({"state_dict": sd, "epoch": 3}, tmp_path / "ckpt.pth")
    loaded = convert.load_state_dict(tmp_path / "ckpt.pth")
    assert list(loaded) == [k for k in sd]
    assert loaded["conv.weight"].dtype == mx.bfloat16
    out = tmp_path / "out.safetensors"
    assert main(["convert", "--from", "spconv", str(tmp_path / "ckpt.pth"), str(out)]) == 0
    assert sorted(mx.load(str(out))) == ["bn.bias", "bn.running_mean", "bn.running_var", "bn.weight", "conv.weight"]


# ------------------------------------------------------ spconv itself (CPU)
@pytest.fixture
def torch_one_thread():
    """torch with one CPU thread (spconv's CPU path races with more)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("on_cpu")  # against spconv's CPU path
def test_spconv_cpu_outputs(torch_one_thread):
    torch = torch_one_thread
    try:
        import spconv.pytorch as spconv
    except Exception as e:  # noqa: BLE001  (any import failure: not installable here)
        pytest.skip(f"spconv is not importable: {e}")
    # spconv's CUDA builds default to implicit GEMM, which refuses CPU tensors
    native = spconv.ConvAlgo.Native
    rng = np.random.default_rng(12)
    src = oracle.random_coords(rng, 80, extent=10, batches=2, low=0).astype(np.int32)
    feats = _rand(rng, len(src), 4)
    net = spconv.SparseSequential(
        spconv.SubMConv3d(4, 6, 3, bias=False, indice_key="s1", algo=native),  # bias: CUDA only in spconv
        torch.nn.BatchNorm1d(6),
        spconv.SparseConv3d(6, 5, (3, 2, 1), stride=2, padding=1, bias=False, algo=native),
    )
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.from_numpy(rng.standard_normal(tuple(p.shape)).astype(np.float32)))
        net[1].running_mean.copy_(torch.from_numpy(_rand(rng, 6)))
        net[1].running_var.copy_(torch.from_numpy(rng.uniform(0.5, 2, 6).astype(np.float32)))
    net.eval()
    shape = [int(src[:, a].max()) + 1 for a in (1, 2, 3)]
    x = spconv.SparseConvTensor(torch.from_numpy(feats), torch.from_numpy(src), shape, 2)
    with torch.no_grad():
        out = net(x)
    # The source columns are (z, y, x) for this model.
    ours = mnn.Sequential(nn.SubmConv3d(4, 6, 3, bias=False), nn.BatchNorm(6),
                          nn.Conv3d(6, 5, (1, 2, 3), stride=2, padding=1, bias=False))
    convert.from_spconv(net.state_dict(), ours, axes="zyx")
    ours.eval()
    y = SparseTensor(mx.array(_ours(src, "zyx")), mx.array(feats))
    y = ours.layers[1](ours.layers[0](y))
    got = ours.layers[2](y, coordinates=mx.array(_ours(out.indices.numpy(), "zyx")))
    _check(got.feats, out.features.numpy(), tol=1e-3)


@pytest.mark.usefixtures("on_cpu")  # against spconv's CPU path
def test_spconv_inverse_cpu_outputs(torch_one_thread):
    """SparseConv3d then SparseInverseConv3d (a U-Net down/up pair) on spconv's
    own output voxels (spconv keeps only outputs inside its spatial shape)."""
    torch = torch_one_thread
    try:
        import spconv.pytorch as spconv
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"spconv is not importable: {e}")
    # spconv's CUDA builds default to implicit GEMM, which refuses CPU tensors
    native = spconv.ConvAlgo.Native
    rng = np.random.default_rng(13)
    src = oracle.random_coords(rng, 80, extent=10, batches=2, low=0).astype(np.int32)
    feats = _rand(rng, len(src), 4)
    net = spconv.SparseSequential(
        spconv.SparseConv3d(4, 6, (3, 2, 1), stride=2, padding=1, bias=False, indice_key="d1", algo=native),
        spconv.SparseInverseConv3d(6, 5, (3, 2, 1), indice_key="d1", bias=False, algo=native),
    )
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.from_numpy(rng.standard_normal(tuple(p.shape)).astype(np.float32)))
    shape = [int(src[:, a].max()) + 1 for a in (1, 2, 3)]
    x = spconv.SparseConvTensor(torch.from_numpy(feats), torch.from_numpy(src), shape, 2)
    with torch.no_grad():
        mid = net[0](x)
        out = net[1](mid)
    ours = mnn.Sequential(nn.Conv3d(4, 6, (1, 2, 3), stride=2, padding=1, bias=False),
                          nn.ConvTranspose3d(6, 5, (1, 2, 3), stride=2, padding=1, bias=False))
    convert.from_spconv(net.state_dict(), ours, axes="zyx")
    c = mx.array(_ours(src, "zyx"))
    h = ours.layers[0](SparseTensor(c, mx.array(feats)), coordinates=mx.array(_ours(mid.indices.numpy(), "zyx")))
    _check(h.feats, mid.features.numpy(), tol=1e-3)
    y = ours.layers[1](h, coordinates=c)
    _check(y.feats, out.features.numpy(), tol=1e-3)
