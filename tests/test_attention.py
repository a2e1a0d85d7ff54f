"""Serialized-patch attention, the PTv3 block, GroupNorm and Softplus against
dense references written here."""

import math

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import nn
from mlx_lattice.serialization import serialization_order

import oracle
from conftest import TOLERANCES, float32_matmul_tolerance, to_np

erf = np.vectorize(math.erf)


def make(rng, n=60, extent=6, batches=2, c=8, dtype=mx.float32):
    coords = oracle.random_coords(rng, n, extent, batches)
    feats = rng.standard_normal((len(coords), c)).astype(np.float32)
    return ml.SparseTensor(coords, mx.array(feats).astype(dtype)), coords, feats


# ------------------------------------------------------------------ attention oracle
def patches(order, batch, patch_size):
    """Lists of rows, patch by patch: each batch item's rows in curve order
    cut into runs of p = min(patch_size, largest item)."""
    items = [[r for r in order if batch[r] == b] for b in sorted(set(batch.tolist()))]
    p = min(patch_size, max(len(i) for i in items))
    return [item[s:s + p] for item in items for s in range(0, len(item), p)]


def attention_ref(feats, order, batch, attn, heads):
    f = np.asarray(feats, np.float64)
    wq, wp = to_np(attn.qkv.weight), to_np(attn.proj.weight)
    bq = to_np(attn.qkv.bias) if "bias" in attn.qkv else 0.0
    qkv = f @ wq.T + bq
    c = f.shape[1]
    d = c // heads
    out = np.zeros_like(f)
    for rows in patches(order, batch, attn.patch_size):
        for h in range(heads):
            q, k, v = (qkv[rows, j * c + h * d: j * c + (h + 1) * d] for j in range(3))
            s = q @ k.T * attn.scale
            w = np.exp(s - s.max(1, keepdims=True))
            out[np.ix_(rows, range(h * d, (h + 1) * d))] = (w / w.sum(1, keepdims=True)) @ v
    return out @ wp.T + to_np(attn.proj.bias)


@pytest.mark.parametrize(
    "n,batches,c,heads,patch",
    [(80, 2, 8, 2, 16), (90, 3, 12, 3, 7), (50, 1, 4, 1, 64), (70, 4, 6, 2, 1), (120, 2, 16, 4, 5)],
)
@pytest.mark.parametrize("curve", ["z", "hilbert-trans"])
def test_attention_matches_dense_patches(rng, n, batches, c, heads, patch, curve):
    x, coords, feats = make(rng, n=n, batches=batches, c=c)
    attn = nn.SerializedAttention(c, heads, patch_size=patch)
    order, _ = serialization_order(coords, curve)
    y = attn(x, order)
    assert y.coordinate_set is x.coordinate_set and y.shape == (len(coords), c)
    ref = attention_ref(feats, order, coords[:, 0], attn, heads)
    np.testing.assert_allclose(to_np(y.feats), ref, rtol=1e-4, atol=1e-4)
    # Without an order, the layer serializes along ``curve`` itself.
    np.testing.assert_array_equal(np.array(attn(x, curve=curve).feats), np.array(y.feats))


def test_padding_is_never_attended(rng):
    """Items of 1, 3 and 10 voxels with patches of 4: the short last patches
    would change every output if padding slots took part."""
    coords = np.array(
        [[0, 0, 0, 0]] + [[1, i, 0, 0] for i in range(3)] + [[2, i, i % 2, 0] for i in range(10)], np.int32
    )
    feats = rng.standard_normal((len(coords), 4)).astype(np.float32)
    x = ml.SparseTensor(coords, feats)
    attn = nn.SerializedAttention(4, 2, patch_size=4, qkv_bias=False)
    order, _ = serialization_order(coords, "z")
    ref = attention_ref(feats, order, coords[:, 0], attn, 2)
    np.testing.assert_allclose(to_np(attn(x, order).feats), ref, rtol=1e-4, atol=1e-4)
    # A single voxel attends to itself only: the output is proj(v).
    v = feats[0] @ to_np(attn.qkv.weight)[8:].T
    np.testing.assert_allclose(to_np(attn(x, order).feats)[0], v @ to_np(attn.proj.weight).T + to_np(attn.proj.bias),
                               rtol=1e-4, atol=1e-5)


def test_patch_layout_shrinks_to_largest_item():
    order = np.arange(5)
    batch = np.array([0, 0, 0, 1, 1])
    slots, rows, valid, p = nn.attention.patch_layout(order, batch, 1024)
    assert p == 3
    assert slots.tolist() == [0, 1, 2, 3, 4]
    assert valid.tolist() == [True] * 5 + [False]
    slots, rows, valid, p = nn.attention.patch_layout(np.array([4, 3, 2, 1, 0])[::-1], batch, 2)
    assert p == 2 and slots.tolist() == [0, 1, 2, 4, 5] and valid.tolist() == [1, 1, 1, 0, 1, 1]


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_attention_half_precision(rng, dtype):
    x, coords, feats = make(rng, n=60, c=8, dtype=dtype)
    attn = nn.SerializedAttention(8, 2, patch_size=16)
    attn.set_dtype(dtype)
    order, _ = serialization_order(coords, "hilbert")
    y = attn(x, order)
    assert y.dtype == dtype
    ref = attention_ref(to_np(x.feats), order, coords[:, 0], attn, 2)
    np.testing.assert_allclose(to_np(y.feats), ref, **TOLERANCES[dtype])


def test_attention_empty_input():
    x = ml.SparseTensor(np.zeros((0, 4), np.int32), np.zeros((0, 6), np.float32))
    y = nn.SerializedAttention(6, 3, patch_size=8)(x)
    assert y.shape == (0, 6)
    y = nn.TransformerBlock(6, 3, patch_size=8)(x)
    assert y.shape == (0, 6)


def test_attention_gradients_match_masked_dense_attention(rng):
    """Gradients against full (N, N) attention with a same-patch mask, built
    from plain MLX ops (no gathers, no fused kernel)."""
    x, coords, feats = make(rng, n=70, batches=3, c=8)
    attn = nn.SerializedAttention(8, 2, patch_size=9)
    order, _ = serialization_order(coords, "z-trans")
    pid = np.zeros(len(coords), np.int64)
    for i, rows in enumerate(patches(order, coords[:, 0], 9)):
        pid[rows] = i
    same = mx.array(pid[:, None] == pid[None, :])

    def dense(f, wq, bq, wp, bp):
        qkv = f @ wq.T + bq
        q, k, v = (qkv[:, j * 8:(j + 1) * 8].reshape(-1, 2, 4).transpose(1, 0, 2) for j in range(3))
        s = mx.where(same, (q @ k.transpose(0, 2, 1)) * attn.scale, -mx.inf)
        o = (mx.softmax(s, axis=-1) @ v).transpose(1, 0, 2).reshape(-1, 8)
        return o @ wp.T + bp

    ct = mx.array(rng.standard_normal((len(coords), 8)).astype(np.float32))

    def loss_layer(f, wq, bq, wp, bp):
        attn.qkv.weight, attn.qkv.bias, attn.proj.weight, attn.proj.bias = wq, bq, wp, bp
        return (attn(x.replace(f), order).feats * ct).sum()

    args = [x.feats, attn.qkv.weight, attn.qkv.bias, attn.proj.weight, attn.proj.bias]
    got = mx.grad(loss_layer, argnums=list(range(5)))(*args)
    want = mx.grad(lambda *a: (dense(*a) * ct).sum(), argnums=list(range(5)))(*args)
    # the dense reference's float32 products follow MLX's precision (TF32 on CUDA)
    mm = float32_matmul_tolerance()
    tol = dict(rtol=max(1e-3, mm["rtol"]), atol=max(1e-4, mm["atol"]))
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.array(g), np.array(w), **tol)


def test_attention_is_bitwise_deterministic_across_threads(rng):
    x, coords, _ = make(rng, n=150, batches=2, c=16)
    block = nn.TransformerBlock(16, 4, patch_size=12)
    order, _ = serialization_order(coords, "hilbert")
    before = ml.num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            ml.set_num_threads(t)
            outs.append(np.array(block(x, order).feats))
    finally:
        ml.set_num_threads(before)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_attention_bad_arguments(rng):
    x, coords, _ = make(rng, n=30, batches=2, c=8)
    with pytest.raises(ValueError, match="num_heads"):
        nn.SerializedAttention(8, 3)
    with pytest.raises(ValueError, match="patch_size"):
        nn.SerializedAttention(8, 2, patch_size=0)
    attn = nn.SerializedAttention(8, 2, patch_size=4)
    with pytest.raises(ValueError, match="channels"):
        nn.SerializedAttention(4, 2)(x)
    with pytest.raises(ValueError, match="permutation"):
        attn(x, np.zeros(len(coords), np.int64))
    with pytest.raises(ValueError, match="shape"):
        attn(x, np.arange(3))
    with pytest.raises(TypeError, match="integer"):
        attn(x, np.arange(len(coords), dtype=np.float32))
    with pytest.raises(ValueError, match="batch item"):
        attn(x, np.arange(len(coords))[::-1].copy())
    with pytest.raises(ValueError, match="curve"):
        attn(x, curve="peano")
    with pytest.raises(TypeError, match="SparseTensor"):
        attn(x.feats)


# ------------------------------------------------------------------ block
def layer_norm(f, w, b, eps=1e-5):
    return (f - f.mean(1, keepdims=True)) / np.sqrt(f.var(1, keepdims=True) + eps) * w + b


def linear(f, layer):
    return f @ to_np(layer.weight).T + to_np(layer.bias)


@pytest.mark.parametrize("pre_norm", [True, False])
def test_block_matches_composition(rng, pre_norm):
    x, coords, feats = make(rng, n=90, batches=2, c=8)
    block = nn.TransformerBlock(8, 2, patch_size=10, mlp_ratio=2.0, pre_norm=pre_norm)
    for norm in (block.cpe.norm, block.norm1, block.norm2):
        norm.weight = mx.array(rng.uniform(0.5, 1.5, 8).astype(np.float32))
        norm.bias = mx.array(rng.standard_normal(8).astype(np.float32))
    order, _ = serialization_order(coords, "z")
    f = feats.astype(np.float64)
    # xCPE: submanifold convolution (dense oracle), Linear, LayerNorm, residual.
    conv = oracle.dense_conv(coords, f, np.array(block.cpe.conv.weight), coords, padding=1) + to_np(block.cpe.conv.bias)
    cpe = block.cpe.norm
    f = f + layer_norm(linear(conv, block.cpe.linear), to_np(cpe.weight), to_np(cpe.bias))

    def attn(g):
        return attention_ref(g, order, coords[:, 0], block.attn, 2)

    def mlp(g):
        h = linear(g, block.mlp.fc1)
        return linear(0.5 * h * (1 + erf(h / np.sqrt(2))), block.mlp.fc2)

    n1 = lambda g: layer_norm(g, to_np(block.norm1.weight), to_np(block.norm1.bias))  # noqa: E731
    n2 = lambda g: layer_norm(g, to_np(block.norm2.weight), to_np(block.norm2.bias))  # noqa: E731
    if pre_norm:
        f = f + attn(n1(f))
        f = f + mlp(n2(f))
    else:
        f = n1(f + attn(f))
        f = n2(f + mlp(f))
    np.testing.assert_allclose(to_np(block(x, order).feats), f, rtol=2e-4, atol=2e-4)


def test_block_drop_path(rng):
    """With a zero MLP branch, training output rows are x + 0 or x + 2 * attn
    (rate 0.5), each with some rows; eval mode adds the branch once."""
    x, coords, feats = make(rng, n=120, batches=2, c=8)
    block = nn.TransformerBlock(8, 2, patch_size=16, cpe=False, drop_path=0.5)
    block.mlp.fc2.weight = mx.zeros_like(block.mlp.fc2.weight)
    block.mlp.fc2.bias = mx.zeros_like(block.mlp.fc2.bias)
    order, _ = serialization_order(coords, "z")
    block.eval()
    branch = np.array(block(x, order).feats) - feats
    block.train()
    mx.random.seed(4)
    got = np.array(block(x, order).feats) - feats
    dropped = np.abs(got).max(1) == 0
    assert 0 < dropped.sum() < len(coords)
    np.testing.assert_allclose(got[~dropped], 2 * branch[~dropped], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="drop_path"):
        nn.TransformerBlock(8, 2, drop_path=1.0)


def test_block_without_cpe_has_no_conv(rng):
    block = nn.TransformerBlock(8, 2, cpe=False)
    assert "cpe" not in block
    x, coords, feats = make(rng, n=30, c=8)
    assert block(x).shape == (len(coords), 8)


# ------------------------------------------------------------------ GroupNorm
def group_norm_ref(coords, feats, groups, w, b, eps=1e-5):
    f = np.asarray(feats, np.float64)
    out = np.zeros_like(f)
    c = f.shape[1]
    k = c // groups
    for bi in np.unique(coords[:, 0]):
        rows = coords[:, 0] == bi
        for g in range(groups):
            block = f[rows, g * k:(g + 1) * k]
            out[rows, g * k:(g + 1) * k] = (block - block.mean()) / np.sqrt(block.var() + eps)
    return out * w + b


@pytest.mark.parametrize("groups,c", [(1, 6), (2, 6), (3, 6), (6, 6), (4, 12)])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_group_norm_matches_reference(rng, groups, c, dtype):
    x, coords, feats = make(rng, n=80, batches=3, c=c, dtype=dtype)
    gn = nn.GroupNorm(groups, c)
    gn.weight = mx.array(rng.uniform(0.5, 1.5, c).astype(np.float32))
    gn.bias = mx.array(rng.standard_normal(c).astype(np.float32))
    y = gn(x)
    assert y.dtype == dtype and y.coordinate_set is x.coordinate_set
    ref = group_norm_ref(coords, to_np(x.feats), groups, to_np(gn.weight), to_np(gn.bias))
    np.testing.assert_allclose(to_np(y.feats), ref, **TOLERANCES[dtype])


def test_group_norm_gradient_and_batch_independence(rng):
    x, coords, feats = make(rng, n=80, batches=2, c=6)
    gn = nn.GroupNorm(3, 6, affine=False)
    ct = rng.standard_normal(feats.shape)
    g = mx.grad(lambda f: (gn(x.replace(f)).feats * mx.array(ct.astype(np.float32))).sum())(x.feats)
    # Finite differences of the oracle on a few entries.
    eps = 1e-4
    for r, ch in [(0, 0), (3, 5), (len(coords) - 1, 2)]:
        fp, fm = feats.astype(np.float64).copy(), feats.astype(np.float64).copy()
        fp[r, ch] += eps
        fm[r, ch] -= eps
        num = ((group_norm_ref(coords, fp, 3, 1, 0) - group_norm_ref(coords, fm, 3, 1, 0)) * ct).sum() / (2 * eps)
        np.testing.assert_allclose(float(g[r, ch]), num, rtol=1e-3, atol=1e-3)
    # Rows of batch item 1 do not depend on item 0's features.
    rows0 = coords[:, 0] == 0
    f2 = feats.copy()
    f2[rows0] *= 3.0
    np.testing.assert_allclose(np.array(gn(x.replace(mx.array(f2))).feats)[~rows0], np.array(gn(x).feats)[~rows0])


def test_group_norm_empty_and_bad_arguments(rng):
    x = ml.SparseTensor(np.zeros((0, 4), np.int32), np.zeros((0, 4), np.float32))
    assert nn.GroupNorm(2, 4)(x).shape == (0, 4)
    with pytest.raises(ValueError, match="multiple of num_groups"):
        nn.GroupNorm(3, 4)
    with pytest.raises(ValueError, match="eps"):
        nn.GroupNorm(2, 4, eps=0)
    y, _, _ = make(rng, c=6)
    with pytest.raises(ValueError, match="channels"):
        nn.GroupNorm(2, 4)(y)
    with pytest.raises(TypeError, match="SparseTensor"):
        nn.GroupNorm(2, 4)(mx.zeros((3, 4)))


# ------------------------------------------------------------------ Softplus
@pytest.mark.parametrize("beta,threshold", [(1.0, 20.0), (2.0, 5.0), (0.5, 20.0)])
def test_softplus(rng, beta, threshold):
    x, coords, feats = make(rng, c=5)
    f = np.concatenate([feats, [[-100, -30, 0, 30, 100]] * 1], axis=0).astype(np.float32)
    act = nn.Softplus(beta, threshold)
    ref = np.where(beta * f.astype(np.float64) > threshold, f,
                   np.log1p(np.exp(np.minimum(beta * f.astype(np.float64), 700))) / beta)
    np.testing.assert_allclose(np.array(act(mx.array(f))), ref, rtol=1e-5, atol=1e-6)
    y = act(x)
    assert y.coordinate_set is x.coordinate_set
    np.testing.assert_allclose(to_np(y.feats), ref[:-1], rtol=1e-5, atol=1e-6)
    g = mx.grad(lambda v: act(v).sum())(mx.array(feats))
    sig = 1 / (1 + np.exp(-beta * feats.astype(np.float64)))
    np.testing.assert_allclose(np.array(g), np.where(beta * feats > threshold, 1.0, sig), rtol=1e-5, atol=1e-6)
    assert act(x.astype(mx.float16)).dtype == mx.float16
    with pytest.raises(ValueError, match="beta"):
        nn.Softplus(beta=0)
