"""QuantizedWeight and quantized convolution on the CPU."""

import numpy as np
import pytest
import mlx.core as mx
import mlx.utils

import mlx_lattice as ml
from mlx_lattice import QuantizedWeight, ops

import oracle
from conftest import to_np


def dequant_reference(q: QuantizedWeight) -> np.ndarray:
    """Unpack MLX's affine format independently: codes along C_in, low bits first."""
    codes = np.array(q.codes).astype(np.uint64)
    per = 32 // q.bits
    shifts = (np.arange(per) * q.bits).astype(np.uint64)
    vals = (codes[..., None] >> shifts) & np.uint64((1 << q.bits) - 1)
    vals = vals.reshape(*codes.shape[:4], -1).astype(np.float64)
    s = np.repeat(to_np(q.scales), q.group_size, axis=-1)
    b = np.repeat(to_np(q.biases), q.group_size, axis=-1)
    return s * vals + b


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_from_float_matches_mx_quantize(rng, bits, group):
    w = mx.array(rng.standard_normal((5, 3, 3, 3, 128)).astype(np.float32))
    q = QuantizedWeight.from_float(w, bits=bits, group_size=group)
    codes, scales, biases = mx.quantize(w, group_size=group, bits=bits)
    assert np.array_equal(np.array(q.codes), np.array(codes))
    assert q.shape == (5, 3, 3, 3, 128) and q.codes.dtype == mx.uint32
    np.testing.assert_allclose(to_np(q.dequantize()), dequant_reference(q), rtol=1e-6, atol=1e-6)
    # quantization error bounded by one step of each element's group (MLX
    # shifts the grid so that zero is exact, which can cost up to a step)
    step = np.repeat(np.abs(to_np(q.scales)), group, axis=-1)
    assert np.all(np.abs(to_np(q.dequantize()) - np.array(w)) <= step + 1e-5)


@pytest.mark.parametrize("op", ["subm", "conv3d", "transpose", "generative", "pointwise"])
@pytest.mark.parametrize("bits,group", [(4, 32), (8, 64)])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_quantized_conv_matches_oracle_on_dequantized_weights(rng, op, bits, group, dtype):
    coords = oracle.random_coords(rng, 60, 6, 2)
    feats = mx.array(rng.standard_normal((len(coords), 64)).astype(np.float32)).astype(dtype)
    x = ml.SparseTensor(coords, feats)
    ks = 1 if op == "pointwise" else 3
    w = mx.array((rng.standard_normal((9, ks, ks, ks, 64)) / 20).astype(np.float32)).astype(dtype)
    q = QuantizedWeight.from_float(w, bits=bits, group_size=group)
    fn = {
        "subm": lambda t, w: ops.subm_conv3d(t, w),
        "conv3d": lambda t, w: ops.conv3d(t, w, stride=2, padding=1),
        "transpose": lambda t, w: ops.conv_transpose3d(t, w, stride=2),
        "generative": lambda t, w: ops.generative_conv_transpose3d(t, w, stride=2),
        "pointwise": lambda t, w: ops.conv3d(t, w),
    }[op]
    with ml.diagnostics.record() as log:
        yq = fn(x, q)
    assert log[0]["route"] == "cpu.quantized_gather_gemm" and log[0]["quantized"] is True
    yd = fn(x, q.dequantize())  # the float route on the dequantized weight
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == mx.float32 else dict(rtol=2e-2, atol=2e-2)
    assert np.array_equal(np.array(yq.coords), np.array(yd.coords))
    np.testing.assert_allclose(to_np(yq.feats), to_np(yd.feats), **tol)
    # and the oracle on the dequantized weight
    sup = np.array(yq.coords)
    if op in ("subm", "pointwise"):
        edges = oracle.conv_edges(coords, sup, ks, 1, (ks - 1) // 2)
    elif op == "conv3d":
        edges = oracle.conv_edges(coords, sup, 3, 2, 1)
    else:
        edges = oracle.transposed_edges(coords, sup, 3, 2, 0)
    ref = oracle.apply(edges, to_np(feats), dequant_reference(q), len(sup))
    np.testing.assert_allclose(to_np(yq.feats), ref, **tol)


def test_quantized_error_bound(rng):
    """|y_q - y| is bounded by sum |x| * (the largest step) over the touched weights."""
    coords = oracle.random_coords(rng, 80, 6, 1)
    feats = rng.standard_normal((len(coords), 64)).astype(np.float32)
    x = ml.SparseTensor(coords, feats)
    w = mx.array((rng.standard_normal((16, 3, 3, 3, 64)) / 10).astype(np.float32))
    q = QuantizedWeight.from_float(w, bits=4, group_size=64)
    diff = np.abs(np.array(ops.subm_conv3d(x, q).feats) - np.array(ops.subm_conv3d(x, w).feats))
    half_step = np.abs(to_np(q.scales)).max()
    edges = oracle.conv_edges(coords, coords, 3, 1, 1)
    bound = np.zeros(len(coords))
    for o, i, k in edges:
        bound[o] += np.abs(feats[i]).sum() * half_step
    assert np.all(diff.max(axis=1) <= bound + 1e-4)
    assert diff.max() > 0  # the bound is not vacuous


def test_quantized_gradients(rng):
    coords = oracle.random_coords(rng, 40, 5, 1)
    feats = mx.array(rng.standard_normal((len(coords), 32)).astype(np.float32))
    x = ml.SparseTensor(coords, feats)
    w = mx.array((rng.standard_normal((8, 3, 3, 3, 32)) / 10).astype(np.float32))
    q = QuantizedWeight.from_float(w, bits=8, group_size=32)
    # features: well defined, equal to the gradient through the dequantized weight
    gq = mx.grad(lambda f: ops.subm_conv3d(x.replace(f), q).feats.sum())(feats)
    gd = mx.grad(lambda f: ops.subm_conv3d(x.replace(f), q.dequantize()).feats.sum())(feats)
    np.testing.assert_allclose(np.array(gq), np.array(gd), rtol=1e-4, atol=1e-4)
    # packed weights: a clear error pointing to dequantize()
    with pytest.raises(ValueError, match=r"dequantize\(\)"):
        mx.grad(
            lambda s: ops.subm_conv3d(x, QuantizedWeight(q.codes, s, q.biases, bits=8, group_size=32)).feats.sum()
        )(q.scales)


def test_quantized_validation(rng):
    w = mx.zeros((4, 3, 3, 3, 48))
    with pytest.raises(ValueError, match="group_size 32 does not divide C_in = 48"):
        QuantizedWeight.from_float(w, bits=4, group_size=32)
    with pytest.raises(ValueError, match="bits must be one of"):
        QuantizedWeight.from_float(mx.zeros((4, 3, 3, 3, 64)), bits=3, group_size=32)
    with pytest.raises(ValueError, match="group_size must be one of"):
        QuantizedWeight.from_float(mx.zeros((4, 3, 3, 3, 64)), bits=4, group_size=16)
    with pytest.raises(ValueError, match="C_in = 48 is not a multiple of 32"):
        QuantizedWeight.from_float(w, bits=4)  # no group size MLX takes divides 48
    q = QuantizedWeight.from_float(mx.zeros((4, 3, 3, 3, 64)), bits=4, group_size=32)
    with pytest.raises(TypeError, match="codes must be uint32"):
        QuantizedWeight(q.codes.astype(mx.int32), q.scales, q.biases, bits=4, group_size=32)
    with pytest.raises(ValueError, match="scales and biases must have shape"):
        QuantizedWeight(q.codes, q.scales[..., :1], q.biases[..., :1], bits=4, group_size=32)
    coords = oracle.random_coords(rng, 20, 4, 1)
    x = ml.SparseTensor(coords, np.zeros((len(coords), 32), np.float32))
    with pytest.raises(ValueError, match="C_in=64"):
        ops.subm_conv3d(x, q)
    assert "bits=4" in repr(q)


def test_quantized_layers_and_model(rng, tmp_path):
    from mlx_lattice import nn as snn
    from mlx_lattice.models import MinkUNet

    coords = oracle.random_coords(rng, 300, 12, 1)
    feats = mx.array(rng.standard_normal((len(coords), 4)).astype(np.float32))
    x = ml.SparseTensor(coords, feats)
    model = MinkUNet(4, 3, width=0.5)
    model.eval()
    y_float = model(x).feats
    with pytest.warns(snn.QuantizationWarning, match=r"C_in=4\): group_size 32 does not divide C_in = 4"):
        snn.quantize(model, bits=8, group_size=32)
    layers = [m for _, m in model.named_modules() if isinstance(m, snn.QuantizedSubmConv3d)]
    assert layers, "no layer was quantized"
    # the stem (4 input channels) cannot be grouped by 32 and stays float
    assert any(isinstance(m, snn.SubmConv3d) and m.weight.shape[-1] == 4 for _, m in model.named_modules())
    assert not any("scales" in k for k, _ in mlx.utils.tree_flatten(model.trainable_parameters()))
    with ml.diagnostics.record() as log:
        y_q = model(x).feats
    assert any(r["route"] == "cpu.quantized_gather_gemm" for r in log)
    rel = np.abs(np.array(y_q) - np.array(y_float)).max() / np.abs(np.array(y_float)).max()
    assert 0 < rel < 0.05
    path = str(tmp_path / "q.safetensors")
    model.save_weights(path)
    other = MinkUNet(4, 3, width=0.5)
    other.eval()
    with pytest.warns(snn.QuantizationWarning):
        snn.quantize(other, bits=8, group_size=32)
    other.load_weights(path)
    np.testing.assert_array_equal(np.array(other(x).feats), np.array(y_q))


def test_quantized_layer_from_float(rng):
    from mlx_lattice import nn as snn

    coords = oracle.random_coords(rng, 60, 6, 1)
    x = ml.SparseTensor(coords, rng.standard_normal((len(coords), 64)).astype(np.float32))
    for layer, q_cls, kw in [
        (snn.SubmConv3d(64, 16, 3), snn.QuantizedSubmConv3d, {}),
        (snn.Conv3d(64, 8, 2, stride=2), snn.QuantizedConv3d, {}),
        (snn.ConvTranspose3d(64, 8, 2, stride=2), snn.QuantizedConvTranspose3d, {}),
        (snn.GenerativeConvTranspose3d(64, 8, 2, stride=2), snn.QuantizedGenerativeConvTranspose3d, {}),
    ]:
        q = q_cls.from_float(layer, bits=4, group_size=64)
        assert isinstance(snn.from_module(layer, 4, 64), q_cls)
        ref = type(layer).__call__(layer, x).feats  # the float layer
        layer.weight = q.quantized_weight().dequantize()
        np.testing.assert_allclose(np.array(q(x).feats), np.array(type(layer).__call__(layer, x).feats), rtol=1e-4, atol=1e-4)
        assert ref.shape == q(x).feats.shape
    with pytest.raises(TypeError, match="needs a SubmConv3d"):
        snn.QuantizedSubmConv3d.from_float(snn.Conv3d(64, 8, 3))


# ------------------------------------------------ default group sizes, and saying what was done
@pytest.mark.parametrize("c_in,group", [(16, None), (32, 32), (48, None), (64, 64), (96, 32), (128, 64),
                                        (160, 32), (192, 64), (256, 64), (4, None), (80, None)])
def test_default_group_size(c_in, group):
    from mlx_lattice.quantized import default_group_size

    assert default_group_size(c_in) == group
    w = mx.array(np.linspace(-1, 1, 2 * c_in, dtype=np.float32).reshape(2, 1, 1, 1, c_in))
    if group is None:
        with pytest.raises(ValueError, match=f"C_in = {c_in} is not a multiple of 32"):
            QuantizedWeight.from_float(w)
    else:
        q = QuantizedWeight.from_float(w, bits=8)
        assert q.group_size == group and q.scales.shape[-1] == c_in // group
        # the packing of MLX's quantize at that group size
        codes, _, _ = mx.quantize(w, group_size=group, bits=8)
        assert np.array_equal(np.array(q.codes), np.array(codes))


def _net(c):
    from mlx_lattice import nn as snn

    mx.random.seed(5)
    return snn.Sequential(snn.SubmConv3d(c, c, 3), snn.ReLU(), snn.Conv3d(c, c, 2, stride=2), snn.ReLU(),
                          snn.ConvTranspose3d(c, c, 2, stride=2), snn.Linear(c, 8))


@pytest.mark.parametrize("c,group", [(32, 32), (96, 32), (64, 64)])
@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_default_takes_common_channel_counts(rng, c, group, bits):
    """nn.quantize(model) with the defaults quantizes every layer of a
    32-, 64- or 96-channel model, and the result is the oracle's product of
    the dequantized codes (unpacked here independently of MLX)."""
    from mlx_lattice import nn as snn
    import warnings

    coords = oracle.random_coords(rng, 120, 8, 2)
    feats = rng.standard_normal((len(coords), c)).astype(np.float32)
    x = ml.SparseTensor(coords, feats)
    model = _net(c)
    model.eval()
    y_float = np.array(model(x).feats)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left float, so nothing to warn about
        assert snn.quantize(model, bits=bits) is model
    kinds = [type(m).__name__ for m in model.layers]
    assert kinds == ["QuantizedSubmConv3d", "ReLU", "QuantizedConv3d", "ReLU", "QuantizedConvTranspose3d",
                     "QuantizedLinear"]
    assert all(m.group_size == group and m.bits == bits for m in model.layers if "Quantized" in type(m).__name__)
    y_q = model(x)
    # the oracle: layer by layer on the dequantized weights, in float64
    sub, down, up, lin = (model.layers[i] for i in (0, 2, 4, 5))
    h = oracle.apply(oracle.conv_edges(coords, coords, 3, 1, 1), feats, dequant_reference(sub.quantized_weight()),
                     len(coords), to_np(sub.bias))
    h = np.maximum(h, 0)
    coarse = oracle.forward_support(coords, 2, 2)
    h = oracle.apply(oracle.conv_edges(coords, coarse, 2, 2), h, dequant_reference(down.quantized_weight()),
                     len(coarse), to_np(down.bias))
    h = np.maximum(h, 0)
    h = oracle.apply(oracle.transposed_edges(coarse, coords, 2, 2), h, dequant_reference(up.quantized_weight()),
                     len(coords), to_np(up.bias))
    ref = oracle.apply(oracle.conv_edges(coords, coords, 1), h, dequant_reference(lin.quantized_weight()),
                       len(coords), to_np(lin.bias))
    assert np.array_equal(np.array(y_q.coords), coords)
    np.testing.assert_allclose(np.array(y_q.feats), ref, rtol=1e-4, atol=1e-4)
    # and the quantization error is that of the bits
    rel = np.abs(ref - y_float).max() / np.abs(y_float).max()
    assert 0 < rel < (0.2 if bits == 4 else 0.02)


def test_quantize_names_the_layers_it_leaves_float(rng, caplog):
    import logging

    from mlx_lattice import nn as snn

    model = snn.Sequential(snn.SubmConv3d(4, 32, 3), snn.ReLU(), snn.SubmConv3d(32, 48, 3),
                           snn.SubmConv3d(48, 16, 3), snn.SubmConv3d(16, 64, 3, groups=4),
                           snn.Sequential(snn.Linear(64, 96), snn.Linear(96, 3)))
    plan = snn.quantization_plan(model, bits=4)
    assert [(d.path, d.group_size) for d in plan.layers] == [
        ("layers.0", None), ("layers.2", 32), ("layers.3", None), ("layers.4", None),
        ("layers.5.layers.0", 64), ("layers.5.layers.1", 32)]
    assert [d.c_in for d in plan.layers] == [4, 32, 48, 16, 64, 96]
    assert "3 of 6" in str(plan) and "layers.3  SubmConv3d(C_in=48)  float" in str(plan)
    assert isinstance(model.layers[0], snn.SubmConv3d)  # the plan changes nothing
    with caplog.at_level(logging.INFO, logger="mlx_lattice.quantize"):
        with pytest.warns(snn.QuantizationWarning) as caught:
            snn.quantize(model, bits=4)
    message = str(caught[0].message)
    assert "left 3 of 6" in message
    assert "layers.0 (SubmConv3d, C_in=4): C_in = 4 is not a multiple of 32" in message
    assert "layers.3 (SubmConv3d, C_in=48): C_in = 48 is not a multiple of 32" in message
    assert "layers.4 (SubmConv3d, C_in=16): groups=4: grouped convolutions take float weights" in message
    assert "3 of 6 convolution/Linear layers quantized" in caplog.text
    kinds = [type(m).__name__ for m in model.layers[:5]] + [type(m).__name__ for m in model.layers[5].layers]
    assert kinds == ["SubmConv3d", "ReLU", "QuantizedSubmConv3d", "SubmConv3d", "SubmConv3d",
                     "QuantizedLinear", "QuantizedLinear"]
    # an explicit group size applies where it divides, and says where it does not
    other = snn.Sequential(snn.Linear(64, 32), snn.Linear(32, 8))
    with pytest.warns(snn.QuantizationWarning, match=r"layers.1 \(Linear, C_in=32\): group_size 64 does not divide"):
        snn.quantize(other, bits=8, group_size=64)
    assert [type(m).__name__ for m in other.layers] == ["QuantizedLinear", "Linear"]


def test_quantize_that_would_do_nothing_raises():
    from mlx_lattice import nn as snn

    with pytest.raises(ValueError, match=r"would quantize no layer(.|\n)*layers.1  SubmConv3d\(C_in=16\)"):
        snn.quantize(snn.Sequential(snn.SubmConv3d(16, 16, 3), snn.SubmConv3d(16, 48, 3)))
    with pytest.raises(ValueError, match="group_size 128 does not divide C_in = 32"):
        snn.quantize(snn.Sequential(snn.SubmConv3d(32, 32, 3)), group_size=128)
    done = snn.Sequential(snn.SubmConv3d(32, 32, 3))
    snn.quantize(done)
    with pytest.raises(ValueError, match="already quantized"):
        snn.quantize(done)
    with pytest.raises(ValueError, match="no mlx_lattice.nn convolution or Linear"):
        snn.quantize(snn.Sequential(snn.ReLU()))
    with pytest.raises(TypeError, match="from_module"):
        snn.quantize(snn.SubmConv3d(32, 32, 3))
    with pytest.raises(ValueError, match="bits must be one of"):
        snn.quantize(snn.Sequential(snn.SubmConv3d(32, 32, 3)), bits=2)
    with pytest.raises(ValueError, match="group_size must be one of"):
        snn.quantization_plan(snn.Sequential(snn.SubmConv3d(32, 32, 3)), group_size=16)
    with pytest.raises(TypeError, match="mlx.nn.Module"):
        snn.quantization_plan([snn.SubmConv3d(32, 32, 3)])


def test_mlx_nn_quantize_defaults(rng):
    """mlx.nn.quantize(model) with MLX's defaults (group_size=None) reaches
    each layer's to_quantized: 32-channel layers take groups of 32; a layer
    no group size fits raises, naming what does fit."""
    import mlx.nn as mnn

    from mlx_lattice import nn as snn

    model = _net(32)
    mnn.quantize(model)
    assert [m.group_size for m in model.layers if "Quantized" in type(m).__name__] == [32, 32, 32, 32]
    assert all(m.bits == 4 for m in model.layers if "Quantized" in type(m).__name__)
    with pytest.raises(ValueError, match=r"C_in = 4 is not a multiple of 32.*to_quantized.*nn.quantize"):
        mnn.quantize(snn.Sequential(snn.SubmConv3d(4, 32, 3), snn.SubmConv3d(32, 32, 3)))


def test_bench_quantized_cases(on_cpu):
    """The bench's quantized workload on a tiny scene: the variants, their
    routes, the weight sizes (computed here from the packing) and errors."""
    from mlx_lattice import scenes
    from mlx_lattice.bench import quantized as qbench

    coords = scenes.uniform_random(2000, 16)
    cases = qbench.layer_cases("random", coords, [32, 64], "float32", rounds=1, min_time_s=0.0)
    assert [(c["c_in"], c["variant"]) for c in cases] == [(c, v) for c in (32, 64) for v in qbench.VARIANTS]
    for c in cases:
        k, ch = 27, c["c_in"]
        if c["variant"] == "float":
            assert c["route"] != "cpu.quantized_gather_gemm" and c["speedup"] == 1.0 and c["max_rel_error"] == 0
            assert c["weight_bytes"] == ch * k * ch * 4
        else:
            bits = int(c["variant"][3:])
            group = 64 if ch % 64 == 0 else 32
            assert c["route"] == "cpu.quantized_gather_gemm" and c["group_size"] == group
            assert c["weight_bytes"] == ch * k * ch * bits // 8 + 2 * ch * k * (ch // group) * 4
            assert 0 < c["max_rel_error"] < (0.2 if bits == 4 else 0.02)
        assert c["ms"] > 0 and c["cpu_ms"] >= 0 and qbench.format_case(c)
    net = qbench.network_cases("random", coords, 0.5, "float32", rounds=1, min_time_s=0.0)
    assert [c["variant"] for c in net] == list(qbench.VARIANTS)
    done, total = net[1]["quantized_layers"]
    assert 0 < done < total  # 0.5x has 16- and 48-channel layers, left float
    assert net[0]["weight_ratio"] == 1.0 and net[2]["weight_ratio"] > net[1]["weight_ratio"] > 1.5
    assert qbench.cpu_name() and qbench.HEADER
