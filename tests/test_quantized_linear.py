"""QuantizedLinear: mx.quantize packing, checked against a NumPy dequantization."""

import numpy as np
import pytest
import mlx.core as mx
import mlx.nn as mnn
import mlx.utils

import mlx_lattice as ml
from mlx_lattice import nn as snn

import oracle
from conftest import float32_matmul_tolerance


def dequant_ref(codes, scales, biases, bits, group_size):
    """Unpack uint32 words (lowest bits first), w = scale * q + bias, float64."""
    codes = np.array(codes).astype(np.uint64)
    per = 32 // bits
    q = np.stack([(codes >> np.uint64(bits * i)) & np.uint64((1 << bits) - 1) for i in range(per)], axis=-1)
    q = q.reshape(codes.shape[0], -1).astype(np.float64)
    s = np.repeat(np.array(scales.astype(mx.float32), np.float64), group_size, axis=1)
    b = np.repeat(np.array(biases.astype(mx.float32), np.float64), group_size, axis=1)
    return s * q + b


@pytest.mark.parametrize("bits,group_size", [(4, 64), (8, 32), (4, 128)])
@pytest.mark.parametrize("bias", [True, False])
def test_quantized_linear(rng, bits, group_size, bias):
    c_in, c_out = 128, 24
    lin = snn.Linear(c_in, c_out, bias=bias)
    q = snn.QuantizedLinear(lin, bits=bits, group_size=group_size)
    assert q.weight.dtype == mx.uint32 and q.weight.shape == (c_out, c_in * bits // 32)
    assert q.scales.shape == (c_out, c_in // group_size)
    w = dequant_ref(q.weight, q.scales, q.biases, bits, group_size)
    step = np.array(q.scales.astype(mx.float32)).max()
    assert np.abs(w - np.array(lin.weight)).max() <= step  # the codes round the float weight
    b = np.array(lin.bias, np.float64) if bias else 0.0
    coords = oracle.random_coords(rng, 80, 6, 2)
    feats = rng.standard_normal((len(coords), c_in)).astype(np.float32)
    x = ml.SparseTensor(coords, feats)
    y = q(x)
    assert y.coordinate_set is x.coordinate_set
    np.testing.assert_allclose(np.array(y.feats), feats.astype(np.float64) @ w.T + b, rtol=1e-4, atol=1e-4)
    # dense arrays, e.g. globally pooled features
    d = rng.standard_normal((3, c_in)).astype(np.float32)
    # (an MLX product: on CUDA its float32 precision is MLX's TF32)
    tol = {k: max(1e-4, v) for k, v in float32_matmul_tolerance().items()}
    np.testing.assert_allclose(np.array(q(mx.array(d))), d @ w.T + b, **tol)
    # the layout of mlx.nn.QuantizedLinear: the same parameters
    ref = mnn.Linear(c_in, c_out, bias=bias)
    ref.weight = lin.weight
    if bias:
        ref.bias = lin.bias
    mq = mnn.QuantizedLinear.from_linear(ref, group_size=group_size, bits=bits)
    for name in ("weight", "scales", "biases"):
        assert np.array_equal(np.array(getattr(mq, name)), np.array(getattr(q, name)))
    assert not mlx.utils.tree_flatten(q.trainable_parameters())
    assert f"bits={bits}" in repr(q)


def test_quantized_linear_conversion_and_errors(rng):
    model = snn.Sequential(snn.Linear(64, 32), snn.ReLU(), snn.Linear(32, 8), snn.Linear(8, 4))
    with pytest.warns(snn.QuantizationWarning, match=r"layers.3 \(Linear, C_in=8\)"):
        snn.quantize(model, bits=8, group_size=32)
    kinds = [type(m).__name__ for m in model.layers]
    assert kinds == ["QuantizedLinear", "ReLU", "QuantizedLinear", "Linear"]  # 8 inputs stay float
    assert isinstance(snn.from_module(snn.Linear(64, 4), 4, 64), snn.QuantizedLinear)
    assert isinstance(snn.Linear(64, 4).to_quantized(group_size=32, bits=4), snn.QuantizedLinear)
    with pytest.raises(ValueError, match="does not divide C_in"):
        snn.QuantizedLinear(snn.Linear(48, 4), group_size=32)
    with pytest.raises(ValueError, match="bits must be"):
        snn.QuantizedLinear(snn.Linear(64, 4), bits=3)
    with pytest.raises(TypeError, match="needs a Linear"):
        snn.QuantizedLinear.from_float(snn.Conv3d(64, 4, 1))
    q = snn.QuantizedLinear(snn.Linear(64, 4), group_size=64)
    e = ml.SparseTensor(np.zeros((0, 4), np.int32), np.zeros((0, 64), np.float32))
    assert q(e).feats.shape == (0, 4)
    coords = oracle.random_coords(rng, 10, 4, 1)
    x = ml.SparseTensor(coords, np.zeros((len(coords), 32), np.float32))
    with pytest.raises(ValueError, match="C_in=64"):
        q(x)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_quantized_linear_half(rng, dtype):
    from conftest import TOLERANCES

    q = snn.QuantizedLinear(snn.Linear(64, 16), bits=4, group_size=32)
    q.set_dtype(dtype)  # scales, biases and bias follow the features' dtype
    assert q.weight.dtype == mx.uint32 and q.scales.dtype == dtype
    w = dequant_ref(q.weight, q.scales, q.biases, 4, 32)
    b = np.array(q.bias.astype(mx.float32), np.float64)
    coords = oracle.random_coords(rng, 40, 5, 2)
    feats = mx.array(rng.standard_normal((len(coords), 64)).astype(np.float32)).astype(dtype)
    f64 = np.array(feats.astype(mx.float32), np.float64)
    y = q(ml.SparseTensor(coords, feats))
    assert y.dtype == dtype
    scale = np.abs(f64 @ w.T + b).max()
    np.testing.assert_allclose(np.array(y.feats.astype(mx.float32)) / scale, (f64 @ w.T + b) / scale, **TOLERANCES[dtype])


def test_quantize_reaches_attention_mlp(rng):
    """nn.quantize swaps the Linear layers inside composite blocks too."""
    mlp = snn.MLP(64, 128)
    coords = oracle.random_coords(rng, 60, 5, 2)
    x = ml.SparseTensor(coords, rng.standard_normal((len(coords), 64)).astype(np.float32))
    y_float = np.array(mlp(x).feats)
    snn.quantize(mlp, bits=8, group_size=64)
    assert isinstance(mlp.fc1, snn.QuantizedLinear) and isinstance(mlp.fc2, snn.QuantizedLinear)
    y = np.array(mlp(x).feats)
    assert 0 < np.abs(y - y_float).max() / np.abs(y_float).max() < 0.05
