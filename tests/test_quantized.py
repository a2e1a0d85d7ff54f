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
