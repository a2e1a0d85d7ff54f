"""Every op against the oracle: supports, values, map kinds, geometries."""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import ops

import oracle
from conftest import TOLERANCES, to_np

KERNELS = [1, 2, 3, 5, (3, 1, 3), (2, 3, 1)]
CHANNELS = [(1, 3), (3, 7), (13, 1), (7, 33), (33, 13), (65, 7)]


def make(rng, n=60, extent=7, batches=2, c_in=3, dtype=mx.float32, low=None):
    coords = oracle.random_coords(rng, n, extent, batches, low)
    feats = rng.standard_normal((len(coords), c_in)).astype(np.float32)
    return ml.SparseTensor(coords, mx.array(feats).astype(dtype)), coords, feats


def weight(rng, c_out, ks, c_in, dtype=mx.float32):
    ks = (ks,) * 3 if isinstance(ks, int) else ks
    w = rng.standard_normal((c_out, *ks, c_in)).astype(np.float32) / np.sqrt(c_in * np.prod(ks))
    return mx.array(w).astype(dtype)


def check(y, expected_coords, expected_feats, tol=TOLERANCES[mx.float32]):
    perm = oracle.match_rows(np.array(y.coords), expected_coords)
    np.testing.assert_allclose(to_np(y.feats)[perm], expected_feats, **tol)


@pytest.mark.parametrize("ks", KERNELS)
@pytest.mark.parametrize("stride,padding,dilation", [(1, 0, 1), (2, 0, 1), (2, 1, 1), (1, 1, 2), ((2, 1, 3), (1, 0, 2), (1, 2, 1))])
def test_conv3d_forward_kind(rng, ks, stride, padding, dilation):
    x, coords, feats = make(rng, c_in=3)
    w = weight(rng, 5, ks, 3)
    y = ops.conv3d(x, w, stride=stride, padding=padding, dilation=dilation)
    support = oracle.forward_support(coords, ks, stride, padding, dilation)
    edges = oracle.conv_edges(coords, support, ks, stride, padding, dilation)
    expected = oracle.apply(edges, feats, np.array(w), len(support))
    check(y, support, expected)
    # the edges themselves agree with the dense definition
    dense = oracle.dense_conv(coords, feats, np.array(w), support, stride, padding, dilation)
    np.testing.assert_allclose(expected, dense, atol=1e-9)
    # forward outputs come sorted by (batch, x, y, z)
    out = np.array(y.coords)
    assert np.array_equal(out, support)
    assert y.stride == tuple(np.broadcast_to(stride, 3))


@pytest.mark.parametrize("c_in,c_out", CHANNELS)
def test_conv3d_awkward_channels(rng, c_in, c_out):
    x, coords, feats = make(rng, c_in=c_in, n=40, extent=5)
    w = weight(rng, c_out, 3, c_in)
    b = mx.array(rng.standard_normal(c_out).astype(np.float32))
    y = ops.conv3d(x, w, b, stride=2, padding=1)
    support = oracle.forward_support(coords, 3, 2, 1)
    edges = oracle.conv_edges(coords, support, 3, 2, 1)
    check(y, support, oracle.apply(edges, feats, np.array(w), len(support), np.array(b)))


@pytest.mark.parametrize("ks", KERNELS)
@pytest.mark.parametrize("dilation", [1, 2, (1, 2, 1)])
def test_subm_conv3d(rng, ks, dilation):
    x, coords, feats = make(rng, c_in=4)
    w = weight(rng, 6, ks, 4)
    b = mx.array(rng.standard_normal(6).astype(np.float32))
    y = ops.subm_conv3d(x, w, b, dilation=dilation)
    pad = oracle.subm_padding(ks, dilation)
    edges = oracle.conv_edges(coords, coords, ks, 1, pad, dilation)
    expected = oracle.apply(edges, feats, np.array(w), len(coords), np.array(b))
    # rows stay in input order, on the same coordinate set
    assert y.coords is x.coords
    np.testing.assert_allclose(to_np(y.feats), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        expected, oracle.dense_conv(coords, feats, np.array(w), coords, 1, pad, dilation) + np.array(b), atol=1e-9
    )


def test_subm_even_kernel_centring(rng):
    # impulse input: kernel size 2 reaches offsets {0, +1} per axis
    coords = np.array([[0, 0, 0, 0], [0, 1, 1, 1], [0, -1, -1, -1]], np.int32)
    feats = np.array([[1.0], [0.0], [0.0]], np.float32)
    x = ml.SparseTensor(coords, feats)
    w = np.zeros((1, 2, 2, 2, 1), np.float32)
    w[0, 0, 0, 0, 0] = 1.0  # weight at offset 0 reads the voxel itself
    w[0, 1, 1, 1, 0] = 10.0  # offset +1 reads (x+1, y+1, z+1)
    y = np.array(ops.subm_conv3d(x, mx.array(w)).feats)[:, 0]
    np.testing.assert_array_equal(y, [1.0, 0.0, 10.0])


def test_conv3d_target(rng):
    x, coords, feats = make(rng, c_in=5)
    target = oracle.random_coords(rng, 50, 9, 2, low=-5)
    w = weight(rng, 3, (3, 2, 3), 5)
    y = ops.conv3d(x, w, stride=(1, 2, 1), padding=1, coordinates=target)
    edges = oracle.conv_edges(coords, target, (3, 2, 3), (1, 2, 1), 1)
    assert np.array_equal(np.array(y.coords), target)  # target rows keep their order
    np.testing.assert_allclose(
        to_np(y.feats), oracle.apply(edges, feats, np.array(w), len(target)), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("ks,stride,padding", [(2, 2, 0), (3, 2, 1), ((3, 1, 2), (2, 1, 2), (1, 0, 0)), (3, 1, 1)])
def test_conv_transpose3d_explicit_target(rng, ks, stride, padding):
    x, coords, feats = make(rng, c_in=4)
    target = oracle.random_coords(rng, 80, 12, 2, low=-8)
    w = weight(rng, 3, ks, 4)
    y = ops.conv_transpose3d(x, w, stride=stride, padding=padding, coordinates=target)
    edges = oracle.transposed_edges(coords, target, ks, stride, padding)
    expected = oracle.apply(edges, feats, np.array(w), len(target))
    np.testing.assert_allclose(
        expected, oracle.dense_conv_transpose(coords, feats, np.array(w), target, stride, padding), atol=1e-9
    )
    assert np.array_equal(np.array(y.coords), target)
    np.testing.assert_allclose(to_np(y.feats), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ks,padding", [(2, 0), (3, 1), (3, 0)])
def test_conv_transpose3d_lands_on_encoder(rng, ks, padding):
    x, coords, feats = make(rng, c_in=3, n=80)
    down = ops.conv3d(x, weight(rng, 8, ks, 3), stride=2, padding=padding)
    d_feats = np.array(down.feats)
    w = weight(rng, 5, ks, 8)
    up = ops.conv_transpose3d(down, w, stride=2, padding=padding)
    assert up.coords is x.coords and up.stride == (1, 1, 1)
    edges = oracle.transposed_edges(np.array(down.coords), coords, ks, 2, padding)
    np.testing.assert_allclose(
        to_np(up.feats), oracle.apply(edges, d_feats, np.array(w), len(coords)), rtol=1e-4, atol=1e-4
    )
    # a different geometry on the same stride still lands on the encoder set
    w2 = weight(rng, 2, 1, 8)
    up2 = ops.conv_transpose3d(down, w2, stride=2)
    assert up2.coords is x.coords
    edges2 = oracle.transposed_edges(np.array(down.coords), coords, 1, 2, 0)
    np.testing.assert_allclose(
        to_np(up2.feats), oracle.apply(edges2, d_feats, np.array(w2), len(coords)), rtol=1e-4, atol=1e-4
    )


def test_conv_transpose3d_upsampled_default(rng):
    x, coords, feats = make(rng, c_in=3)
    w = weight(rng, 4, 2, 3)
    y = ops.conv_transpose3d(x, w, stride=2)
    expected_coords = coords.astype(np.int64) * np.array([1, 2, 2, 2])
    edges = oracle.transposed_edges(coords, expected_coords, 2, 2, 0)
    check(y, expected_coords, oracle.apply(edges, feats, np.array(w), len(coords)))


@pytest.mark.parametrize("ks,stride,padding,dilation", [(2, 2, 0, 1), (3, 2, 1, 1), (3, 1, 1, 1), ((1, 3, 2), (1, 2, 2), 0, (1, 2, 1))])
def test_generative_conv_transpose3d(rng, ks, stride, padding, dilation):
    x, coords, feats = make(rng, c_in=3, n=30)
    w = weight(rng, 4, ks, 3)
    y = ops.generative_conv_transpose3d(x, w, stride=stride, padding=padding, dilation=dilation)
    support = oracle.generative_support(coords, ks, stride, padding, dilation)
    edges = oracle.transposed_edges(coords, support, ks, stride, padding, dilation)
    expected = oracle.apply(edges, feats, np.array(w), len(support))
    np.testing.assert_allclose(
        expected,
        oracle.dense_conv_transpose(coords, feats, np.array(w), support, stride, padding, dilation),
        atol=1e-9,
    )
    assert np.array_equal(np.array(y.coords), support)
    np.testing.assert_allclose(to_np(y.feats), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("op", ["conv3d", "subm", "transpose", "generative", "pointwise"])
def test_dtypes(rng, dtype, op):
    x, coords, feats = make(rng, c_in=16, dtype=dtype)
    feats_q = to_np(x.feats)  # oracle sees the rounded inputs
    ks = 1 if op == "pointwise" else 3
    w = weight(rng, 12, ks, 16, dtype)
    w_q = to_np(w)
    if op == "conv3d":
        y = ops.conv3d(x, w, stride=2, padding=1)
        sup = oracle.forward_support(coords, 3, 2, 1)
        edges = oracle.conv_edges(coords, sup, 3, 2, 1)
    elif op == "subm":
        y = ops.subm_conv3d(x, w)
        sup = coords
        edges = oracle.conv_edges(coords, coords, 3, 1, 1)
    elif op == "transpose":
        y = ops.conv_transpose3d(x, w, stride=2, padding=1)
        sup = coords.astype(np.int64) * np.array([1, 2, 2, 2])
        edges = oracle.transposed_edges(coords, sup, 3, 2, 1)
    elif op == "generative":
        y = ops.generative_conv_transpose3d(x, w, stride=2)
        sup = oracle.generative_support(coords, 3, 2)
        edges = oracle.transposed_edges(coords, sup, 3, 2, 0)
    else:
        y = ops.conv3d(x, w)
        sup = coords
        edges = oracle.conv_edges(coords, coords, 1)
    assert y.feats.dtype == dtype
    check(y, sup, oracle.apply(edges, feats_q, w_q, len(sup)), TOLERANCES[dtype])


def test_pointwise_keeps_rows_and_set(rng, on_cpu):
    x, coords, feats = make(rng, c_in=7)
    w = weight(rng, 9, 1, 7)
    with ml.diagnostics.record() as log:
        y = ops.conv3d(x, w)
    assert log[0]["route"] == "cpu.pointwise"
    assert y.coords is x.coords
    np.testing.assert_allclose(to_np(y.feats), feats @ np.array(w)[:, 0, 0, 0, :].T, rtol=1e-5, atol=1e-5)
    assert x.manager.stats()["relations"] == 0  # no relation was needed


def test_negative_and_large_coordinates(rng):
    coords = oracle.random_coords(rng, 60, 6, 2, low=-65536)
    coords[:10, 1:] += 65530  # upper edge of the range too
    coords = np.unique(coords, axis=0)
    feats = rng.standard_normal((len(coords), 2)).astype(np.float32)
    x = ml.SparseTensor(coords, feats)
    w = weight(rng, 3, 3, 2)
    y = ops.subm_conv3d(x, w)
    edges = oracle.conv_edges(coords, coords, 3, 1, 1)
    np.testing.assert_allclose(to_np(y.feats), oracle.apply(edges, feats, np.array(w), len(coords)), atol=1e-4)


def test_batches_do_not_mix(rng):
    base = oracle.random_coords(rng, 30, 5, 1)
    coords = np.concatenate([base, base + np.array([1, 0, 0, 0]), base + np.array([3, 0, 0, 0])]).astype(np.int32)
    feats = rng.standard_normal((len(coords), 2)).astype(np.float32)
    x = ml.SparseTensor(coords, feats)
    assert list(x.batch_counts) == [len(base), len(base), 0, len(base)]
    w = weight(rng, 2, 3, 2)
    y = np.array(ops.subm_conv3d(x, w).feats)
    single = np.array(ops.subm_conv3d(ml.SparseTensor(base, feats[: len(base)]), w).feats)
    np.testing.assert_allclose(y[: len(base)], single, rtol=1e-6, atol=1e-6)


def test_unet_chain(rng):
    """Encoder-decoder on one manager: maps built once, decoder on encoder voxels."""
    x, coords, feats = make(rng, c_in=4, n=120, extent=9)
    m = x.manager
    w = {k: weight(rng, *k) for k in [(8, 3, 4), (8, 3, 8), (16, 2, 8), (16, 3, 16), (8, 2, 16)]}
    a = ops.subm_conv3d(x, w[(8, 3, 4)])
    a = ops.subm_conv3d(a, w[(8, 3, 8)])
    builds = m.builds
    ops.subm_conv3d(a, w[(8, 3, 8)])  # same geometry: cached
    assert m.builds == builds and m.hits >= 1
    b = ops.conv3d(a, w[(16, 2, 8)], stride=2)
    c = ops.subm_conv3d(b, w[(16, 3, 16)])
    d = ops.conv_transpose3d(c, w[(8, 2, 16)], stride=2)
    assert d.coords is x.coords
    # reference through the oracle, layer by layer
    e1 = oracle.conv_edges(coords, coords, 3, 1, 1)
    r = oracle.apply(e1, feats, np.array(w[(8, 3, 4)]), len(coords))
    r = oracle.apply(e1, r, np.array(w[(8, 3, 8)]), len(coords))
    sb = oracle.forward_support(coords, 2, 2, 0)
    r = oracle.apply(oracle.conv_edges(coords, sb, 2, 2, 0), r, np.array(w[(16, 2, 8)]), len(sb))
    r = oracle.apply(oracle.conv_edges(sb, sb, 3, 1, 1), r, np.array(w[(16, 3, 16)]), len(sb))
    r = oracle.apply(oracle.transposed_edges(sb, coords, 2, 2, 0), r, np.array(w[(8, 2, 16)]), len(coords))
    np.testing.assert_allclose(to_np(d.feats), r, rtol=1e-4, atol=1e-4)


def test_nan_passes_through(rng):
    x, coords, feats = make(rng, c_in=2, n=20, extent=4)
    feats = feats.copy()
    feats[0, 0] = np.nan
    x = ml.SparseTensor(coords, feats)
    y = np.array(ops.subm_conv3d(x, weight(rng, 2, 3, 2)).feats)
    edges = oracle.conv_edges(coords, coords, 3, 1, 1)
    touched = {o for o, i, k in edges if i == 0}
    assert all(np.isnan(y[o]).all() for o in touched)
    assert not np.isnan(np.delete(y, list(touched), axis=0)).any()



def test_record_products_replays_each_kernel_call(rng, on_cpu):
    x, _, _ = make(rng, c_in=4)
    w3, w2 = weight(rng, 5, 3, 4), weight(rng, 6, 2, 4)
    with ml.diagnostics.record() as log, ops.record_products() as outer:
        with ops.record_products() as inner:
            y = ops.subm_conv3d(x, w3)
        z = ops.conv3d(x, w2, stride=2)
    ops.subm_conv3d(x, w3)  # after the blocks: recorded nowhere
    assert [p.op for p in inner] == ["subm_conv3d"]
    assert [p.op for p in outer] == ["subm_conv3d", "conv3d"] and outer[0] is inner[0]
    assert [p.kind for p in outer] == ["submanifold", "forward"]
    assert outer[1].geometry.kernel_size == (2, 2, 2) and outer[1].geometry.stride == (2, 2, 2)
    assert [p.route for p in outer] == [e["route"] for e in log]
    for p, out in zip(outer, (y, z)):
        assert p.x is x.feats and p.backend == "cpu" and not p.quantized and p.groups == 1
        assert p.host_s > 0 and p.variant is None
        again = ml.backends.get(p.backend).launch(p.route, "conv", p.x, p.weight, p.view, groups=p.groups)
        np.testing.assert_array_equal(np.array(again), np.array(out.feats))
