"""The native CPU patch-attention primitive (`_ext.patch_attention`) and its
backward, against dense per-patch attention and its hand-derived gradients
in float64 NumPy written here."""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import _ext
from mlx_lattice.nn.attention import patch_attention

from conftest import TOLERANCES, to_np

# The primitive is the CPU kernel: pin the CPU backend whatever the default device.
pytestmark = pytest.mark.usefixtures("on_cpu")

DTYPES = [mx.float32, mx.float16, mx.bfloat16]


def dense_attention(q, k, v, lengths, scale, do=None, dlse=None):
    """Per patch and head over the first `length` slots, in float64:
    o, lse and, given cotangents do (and dlse), dq, dk, dv. Padding rows are
    zero in every result."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    o, dq, dk, dv = (np.zeros_like(q) for _ in range(4))
    lse = np.zeros(q.shape[:3])
    for b, n in enumerate(lengths):
        for h in range(q.shape[1]):
            if n == 0:
                continue
            qq, kk, vv = q[b, h, :n], k[b, h, :n], v[b, h, :n]
            s = scale * qq @ kk.T
            m = s.max(1, keepdims=True)
            e = np.exp(s - m)
            p = e / e.sum(1, keepdims=True)
            o[b, h, :n] = p @ vv
            lse[b, h, :n] = (m + np.log(e.sum(1, keepdims=True)))[:, 0]
            if do is None:
                continue
            g = np.asarray(do, np.float64)[b, h, :n]
            # d/ds_ij of sum(do * o) + sum(dlse * lse): p_ij (dP_ij - <do_i, o_i> + dlse_i).
            dl = 0.0 if dlse is None else np.asarray(dlse, np.float64)[b, h, :n, None]
            ds = p * (g @ vv.T - (g * o[b, h, :n]).sum(1, keepdims=True) + dl)
            dv[b, h, :n] = p.T @ g
            dq[b, h, :n] = scale * ds @ kk
            dk[b, h, :n] = scale * ds.T @ qq
    return o, lse, dq, dk, dv


def inputs(rng, b, h, p, d, dtype=mx.float32):
    arrs = [rng.standard_normal((b, h, p, d)).astype(np.float32) for _ in range(3)]
    return [mx.array(a).astype(dtype) for a in arrs]


def lengths_for(rng, b, p):
    n = rng.integers(0, p + 1, b).astype(np.int32)
    n[0] = p  # a full patch
    if b > 2:
        n[-1] = 0  # a fully padded patch
    return n


def grads(q, k, v, lengths, scale, do, dlse=None):
    def loss(q, k, v):
        o, lse = _ext.patch_attention(q, k, v, mx.array(lengths), scale)
        total = (o * do).astype(mx.float32).sum()
        if dlse is not None:
            total = total + (lse * dlse).sum()
        return total

    return mx.grad(loss, argnums=(0, 1, 2))(q, k, v)


# awkward head dims and patch sizes that are not multiples of the tiles
@pytest.mark.parametrize("d", [1, 3, 16, 24, 40, 48])
@pytest.mark.parametrize("p", [1, 7, 70, 150])
def test_forward_matches_dense(rng, d, p):
    b, h = 4, 2
    q, k, v = inputs(rng, b, h, p, d)
    n = lengths_for(rng, b, p)
    scale = d ** -0.5
    o, lse = _ext.patch_attention(q, k, v, mx.array(n), scale)
    ro, rl, *_ = dense_attention(q, k, v, n, scale)
    assert o.shape == q.shape and o.dtype == mx.float32
    assert lse.shape == q.shape[:3] and lse.dtype == mx.float32
    np.testing.assert_allclose(np.array(o), ro, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(np.array(lse), rl, rtol=1e-5, atol=2e-6)
    for bi, ni in enumerate(n):  # padding rows are exactly zero
        assert not np.array(o)[bi, :, ni:].any()


def test_forward_long_patch_crosses_key_blocks(rng):
    # Several key blocks with an online-softmax rescale, large score spread.
    q, k, v = inputs(rng, 2, 1, 700, 8)
    q = q * 4.0
    n = np.array([700, 333], np.int32)
    o, lse = _ext.patch_attention(q, k, v, mx.array(n), 0.5)
    ro, rl, *_ = dense_attention(q, k, v, n, 0.5)
    np.testing.assert_allclose(np.array(o), ro, rtol=1e-5, atol=5e-6)
    np.testing.assert_allclose(np.array(lse), rl, rtol=1e-5, atol=5e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_dtypes(rng, dtype):
    q, k, v = inputs(rng, 3, 2, 45, 24, dtype)
    n = np.array([45, 20, 0], np.int32)
    o, lse = _ext.patch_attention(q, k, v, mx.array(n), 0.3)
    assert o.dtype == dtype and lse.dtype == mx.float32
    ro, rl, *_ = dense_attention(to_np(q), to_np(k), to_np(v), n, 0.3)
    np.testing.assert_allclose(to_np(o), ro, **TOLERANCES[dtype])
    np.testing.assert_allclose(np.array(lse), rl, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("d,p", [(16, 70), (24, 130), (40, 9), (3, 1)])
def test_gradients_match_dense(rng, d, p):
    b, h = 4, 2
    q, k, v = inputs(rng, b, h, p, d)
    n = lengths_for(rng, b, p)
    scale = 0.7 * d ** -0.5
    do = rng.standard_normal(q.shape).astype(np.float32)
    got = grads(q, k, v, n, scale, mx.array(do))
    *_, dq, dk, dv = dense_attention(q, k, v, n, scale, do)
    for g, w in zip(got, (dq, dk, dv)):
        np.testing.assert_allclose(np.array(g), w, rtol=1e-4, atol=2e-5)


def test_gradients_through_log_sum_exp(rng):
    q, k, v = inputs(rng, 2, 2, 90, 16)
    n = np.array([90, 41], np.int32)
    do = rng.standard_normal(q.shape).astype(np.float32)
    dlse = rng.standard_normal(q.shape[:3]).astype(np.float32)
    got = grads(q, k, v, n, 0.25, mx.array(do), mx.array(dlse))
    *_, dq, dk, dv = dense_attention(q, k, v, n, 0.25, do, dlse)
    for g, w in zip(got, (dq, dk, dv)):
        np.testing.assert_allclose(np.array(g), w, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_gradients_half_precision(rng, dtype):
    q, k, v = inputs(rng, 2, 2, 33, 24, dtype)
    n = np.array([33, 10], np.int32)
    do = mx.array(rng.standard_normal(q.shape).astype(np.float32)).astype(dtype)
    got = grads(q, k, v, n, 0.2, do)
    *_, dq, dk, dv = dense_attention(to_np(q), to_np(k), to_np(v), n, 0.2, to_np(do))
    for g, w in zip(got, (dq, dk, dv)):
        assert g.dtype == dtype
        np.testing.assert_allclose(to_np(g), w, **TOLERANCES[dtype])


def test_empty_inputs():
    for shape in [(0, 2, 5, 8), (2, 2, 0, 8)]:
        q = mx.zeros(shape)
        o, lse = _ext.patch_attention(q, q, q, mx.zeros((shape[0],), mx.int32), 1.0)
        assert o.shape == shape and lse.shape == shape[:3]
        g = mx.grad(lambda q: _ext.patch_attention(q, q, q, mx.zeros((shape[0],), mx.int32), 1.0)[0].sum())(q)
        assert g.shape == shape


def test_fully_padded_patches_are_zero_with_zero_gradients(rng):
    q, k, v = inputs(rng, 2, 3, 20, 8)
    n = mx.array(np.array([0, 0], np.int32))
    o, lse = _ext.patch_attention(q, k, v, n, 1.0)
    assert not np.array(o).any() and not np.array(lse).any()
    g = mx.grad(lambda q, k, v: _ext.patch_attention(q, k, v, n, 1.0)[0].sum(), argnums=(0, 1, 2))(q, k, v)
    assert not any(np.array(a).any() for a in g)


def test_padding_contents_are_ignored(rng):
    q, k, v = inputs(rng, 2, 2, 40, 16)
    n = np.array([40, 17], np.int32)
    noisy = [mx.array(np.where(np.arange(40)[None, None, :, None] < n[:, None, None, None], np.array(a), 1e30))
             for a in (q, k, v)]
    for a, b in zip(_ext.patch_attention(q, k, v, mx.array(n), 0.3),
                    _ext.patch_attention(*noisy, mx.array(n), 0.3)):
        np.testing.assert_array_equal(np.array(a), np.array(b))


def test_non_contiguous_inputs(rng):
    qkv = mx.array(rng.standard_normal((3, 40, 2, 16)).astype(np.float32))  # (3, P, H, D)
    q, k, v = (qkv[i].transpose(1, 0, 2)[None] for i in range(3))
    n = np.array([31], np.int32)
    o, _ = _ext.patch_attention(q, k, v, mx.array(n), 0.25)
    ro, *_ = dense_attention(np.array(q), np.array(k), np.array(v), n, 0.25)
    np.testing.assert_allclose(np.array(o), ro, rtol=1e-5, atol=2e-6)


def test_bitwise_identical_across_thread_counts(rng):
    q, k, v = inputs(rng, 3, 2, 200, 24)
    n = mx.array(np.array([200, 130, 77], np.int32))
    do = mx.array(rng.standard_normal(q.shape).astype(np.float32))
    before = ml.num_threads()
    outs = []
    try:
        for t in (1, 2, 3, 5):
            ml.set_num_threads(t)
            o, lse = _ext.patch_attention(q, k, v, n, 0.2)
            g = grads(q, k, v, np.array(n), 0.2, do)
            outs.append([np.array(a) for a in (o, lse, *g)])
    finally:
        ml.set_num_threads(before)
    for run in outs[1:]:
        for a, b in zip(run, outs[0]):
            np.testing.assert_array_equal(a, b)


def test_bad_arguments(rng):
    q, k, v = inputs(rng, 2, 2, 8, 4)
    n = mx.array(np.array([8, 3], np.int32))
    with pytest.raises(ValueError, match="share one shape"):
        _ext.patch_attention(q, k[:, :, :4], v, n, 1.0)
    with pytest.raises(ValueError, match="share one shape"):
        _ext.patch_attention(q[0], k[0], v[0], n, 1.0)
    with pytest.raises(ValueError, match="dtype"):
        _ext.patch_attention(q, k.astype(mx.float16), v, n, 1.0)
    with pytest.raises(ValueError, match="dtype"):
        _ext.patch_attention(*(a.astype(mx.int32) for a in (q, k, v)), n, 1.0)
    with pytest.raises(ValueError, match="lengths"):
        _ext.patch_attention(q, k, v, n[:1], 1.0)
    with pytest.raises(ValueError, match="valid"):
        patch_attention(q, k, v, np.array([[True] * 8, [False, True] + [False] * 6]), 1.0)
    with pytest.raises(ValueError, match="jvp"):
        mx.jvp(lambda q: _ext.patch_attention(q, k, v, n, 1.0)[0], [q], [q])


def test_matches_fused_sdpa_on_valid_rows(rng):
    # The GPU path's op (run here on the CPU) agrees on every valid row.
    q, k, v = inputs(rng, 3, 2, 50, 24)
    valid = np.arange(50)[None, :] < np.array([50, 21, 1])[:, None]
    got = np.array(patch_attention(q, k, v, valid, 0.3))
    want = np.array(mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask=mx.array(valid[:, None, None, :])))
    rows = np.broadcast_to(valid[:, None, :], got.shape[:3])
    np.testing.assert_allclose(got[rows], want[rows], rtol=1e-5, atol=2e-6)
    assert not got[~rows].any()


def test_dominant_key_gets_all_the_weight_exactly(rng):
    # Consecutive keys' scores 200 apart: every other key's weight underflows
    # to exactly zero, as does the rescale of earlier key blocks when the
    # best key comes late, so each output is bit for bit one value row.
    p, d = 300, 8
    k = np.zeros((1, 1, p, d), np.float32)
    k[0, 0, :, 0] = np.arange(p)
    sign = rng.choice([-1.0, 1.0], p).astype(np.float32)
    q = np.zeros((1, 1, p, d), np.float32)
    q[0, 0, :, 0] = 200.0 * sign
    v = rng.standard_normal((1, 1, p, d)).astype(np.float32)
    o, _ = _ext.patch_attention(mx.array(q), mx.array(k), mx.array(v), mx.array(np.array([p], np.int32)), 1.0)
    best = np.where(sign > 0, p - 1, 0)
    np.testing.assert_array_equal(np.array(o)[0, 0], v[0, 0, best])
