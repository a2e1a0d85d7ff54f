"""Serialized-patch attention over sparse voxels (Point Transformer V3).

The voxels of each batch item are laid out along a space-filling curve
(:mod:`mlx_lattice.serialization`) and cut into consecutive patches of
``patch_size`` voxels; multi-head self-attention runs inside each patch
(:func:`patch_attention`: the native kernel on the CPU,
``mx.fast.scaled_dot_product_attention`` on the GPU). A batch item whose
voxel count is not a multiple of the patch size gets a shorter last patch: its
empty slots are masked out as keys (no voxel attends to them) and their
outputs are dropped. When every batch item is smaller than ``patch_size``,
the patch shrinks to the largest item, so small inputs do not pay for
padding they cannot fill.
"""

from __future__ import annotations

import numpy as np
import mlx.core as mx
import mlx.nn as mnn

from .. import _ext, backends
from ..serialization import CURVES, serialization_order
from ..tensor import SparseTensor
from .activations import GELU
from .convolution import Linear, SubmConv3d
from .normalization import LayerNorm


def patch_layout(order: np.ndarray, batch: np.ndarray, patch_size: int):
    """Padded patch layout of rows taken in ``order``.

    ``batch``: each row's batch item. Returns ``(slots, rows, valid, p)``:
    ``p`` the patch size used; ``slots`` (N,) the padded slot of each row;
    ``rows`` (S,) the row read into each slot (0 in padding slots); ``valid``
    (S,) bool, False in padding; ``S`` a multiple of ``p``. Each batch item
    starts a new patch, and only its last patch holds padding.
    """
    n = len(order)
    b_sorted = batch[order]
    if n and (np.diff(b_sorted) < 0).any():
        raise ValueError("order must keep each batch item's rows together, in batch order")
    _, counts = np.unique(b_sorted, return_counts=True)
    p = int(min(patch_size, counts.max())) if n else int(patch_size)
    padded = -(-counts // p) * p
    start = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    pad_start = np.concatenate([[0], np.cumsum(padded)[:-1]]).astype(np.int64)
    # Rank of each sorted row inside its batch item, moved to the item's padded start.
    item = np.repeat(np.arange(len(counts)), counts)
    sorted_slot = np.arange(n) - start[item] + pad_start[item]
    slots = np.empty(n, dtype=np.int64)
    slots[order] = sorted_slot
    s = int(padded.sum())
    rows = np.zeros(s, dtype=np.int64)
    rows[sorted_slot] = order
    valid = np.zeros(s, dtype=bool)
    valid[sorted_slot] = True
    return slots, rows, valid, p


def patch_attention(q: mx.array, k: mx.array, v: mx.array, valid: np.ndarray, scale: float) -> mx.array:
    """``softmax(q k^T * scale) v`` per patch and head; q, k, v
    ``(patches, heads, p, head_dim)``, ``valid`` ``(patches, p)`` bool with
    each patch's valid slots first. Padding slots are never attended to;
    their outputs are zero on the CPU and unspecified on the GPU.

    On a CPU default device this is the native kernel (flash-style tiling,
    float32 accumulation, deterministic across thread counts, with its own
    backward); on the GPU, ``mx.fast.scaled_dot_product_attention`` with a
    key mask.
    """
    if backends.current().native_patch_attention:
        lengths = valid.sum(axis=1).astype(np.int32)
        if (valid != (np.arange(valid.shape[1]) < lengths[:, None])).any():
            raise ValueError("valid must hold each patch's valid slots first")
        return _ext.patch_attention(q, k, v, mx.array(lengths), float(scale))[0]
    mask = None if valid.all() else mx.array(valid[:, None, None, :])
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


def _as_order(order, n: int) -> np.ndarray:
    o = np.asarray(order)
    if not np.issubdtype(o.dtype, np.integer):
        raise TypeError(f"order must be an integer permutation of the rows, got dtype {o.dtype}")
    if o.shape != (n,):
        raise ValueError(f"order must have shape ({n},), got {o.shape}")
    o = o.astype(np.int64)
    seen = np.zeros(n, dtype=bool)
    if n and (o.min() < 0 or o.max() >= n):
        raise ValueError(f"order must be a permutation of range({n})")
    seen[o] = True
    if not seen.all():
        raise ValueError(f"order must be a permutation of range({n})")
    return o


class SerializedAttention(mnn.Module):
    """Multi-head self-attention within serialized patches.

    ``SerializedAttention(channels, num_heads, patch_size=1024)``; the call
    ``attn(x, order=None, curve="z")`` takes a SparseTensor ``(N, channels)``
    and returns one on the same rows. ``order`` is a row permutation that
    keeps batch items together (from
    :func:`mlx_lattice.serialization.serialization_order`); without it the
    order of ``curve`` is computed from ``x.coords``.

    Per patch: ``q, k, v = split(x W_qkv^T + b_qkv)`` into ``num_heads`` heads
    of ``channels // num_heads``; ``softmax(q k^T * scale) v`` over the
    patch's voxels (``scale`` defaults to ``head_dim ** -0.5``); heads
    concatenated; output projection ``W_proj``. Projections are
    :class:`Linear` layers on the voxels (the project's pointwise kernel).
    """

    def __init__(self, channels: int, num_heads: int, patch_size: int = 1024,
                 qkv_bias: bool = True, scale: float | None = None):
        super().__init__()
        if channels < 1 or num_heads < 1 or channels % num_heads:
            raise ValueError(f"channels ({channels}) must be a positive multiple of num_heads ({num_heads})")
        if isinstance(patch_size, bool) or not isinstance(patch_size, int) or patch_size < 1:
            raise ValueError(f"patch_size must be a positive int, got {patch_size!r}")
        self.channels = channels
        self.num_heads = num_heads
        self.patch_size = patch_size
        self.scale = (channels // num_heads) ** -0.5 if scale is None else float(scale)
        self.qkv = Linear(channels, 3 * channels, bias=qkv_bias)
        self.proj = Linear(channels, channels)

    def _extra_repr(self):
        return f"{self.channels}, num_heads={self.num_heads}, patch_size={self.patch_size}, scale={self.scale:.4g}"

    def __call__(self, x: SparseTensor, order=None, curve: str = "z") -> SparseTensor:
        if not isinstance(x, SparseTensor):
            raise TypeError(f"SerializedAttention needs a SparseTensor, got {type(x).__name__}")
        n, c = x.shape
        if c != self.channels:
            raise ValueError(f"SerializedAttention({self.channels}) got {c} channels")
        if n == 0:
            return self.proj(x)
        if order is None:
            if curve not in CURVES:
                raise ValueError(f"curve must be one of {list(CURVES)}, got {curve!r}")
            order, _ = serialization_order(x.coords, curve)
        order = _as_order(order, n)
        batch = np.array(x.coords)[:, 0].astype(np.int64)
        slots, rows, valid, p = patch_layout(order, batch, self.patch_size)
        h, d = self.num_heads, c // self.num_heads
        qkv = self.qkv(x).feats[mx.array(rows.astype(np.int32))]
        qkv = qkv.reshape(-1, p, 3, h, d).transpose(2, 0, 3, 1, 4)  # (3, patches, H, P, D)
        y = patch_attention(qkv[0], qkv[1], qkv[2], valid.reshape(-1, p), self.scale)
        y = y.transpose(0, 2, 1, 3).reshape(-1, c)[mx.array(slots.astype(np.int32))]
        return self.proj(x.replace(y))


class MLP(mnn.Module):
    """``Linear(C, hidden) -> GELU -> Linear(hidden, C)`` on each voxel."""

    def __init__(self, channels: int, hidden: int):
        super().__init__()
        self.fc1 = Linear(channels, hidden)
        self.act = GELU()
        self.fc2 = Linear(hidden, channels)

    def __call__(self, x):
        return self.fc2(self.act(self.fc1(x)))


class ConditionalPositionalEncoding(mnn.Module):
    """PTv3's xCPE: submanifold convolution, Linear, LayerNorm, added to the
    input (``x + LN(Linear(subm_conv(x)))``): position enters through the
    convolution's kernel offsets."""

    def __init__(self, channels: int, kernel_size: int = 3):
        super().__init__()
        self.conv = SubmConv3d(channels, channels, kernel_size, bias=True)
        self.linear = Linear(channels, channels)
        self.norm = LayerNorm(channels)

    def __call__(self, x: SparseTensor) -> SparseTensor:
        y = self.norm(self.linear(self.conv(x)))
        return x.replace(x.feats + y.feats)


def drop_rows(f: mx.array, rate: float) -> mx.array:
    """Stochastic depth on a residual branch: zero each voxel's row with
    probability ``rate`` and scale the kept rows by ``1 / (1 - rate)``."""
    keep = mx.random.bernoulli(1.0 - rate, (f.shape[0], 1))
    return mx.where(keep, f * (1.0 / (1.0 - rate)), mx.zeros_like(f))


class TransformerBlock(mnn.Module):
    """A Point Transformer V3 block on a SparseTensor ``(N, channels)``:

        x = x + xCPE(x)                     (when cpe is True)
        x = x + Attn(LN(x), order)
        x = x + MLP(LN(x))

    (``pre_norm=False`` moves each LayerNorm after its residual sum, as PTv3
    allows.) ``order`` as for :class:`SerializedAttention`. ``drop_path``:
    in training mode, each voxel's attention and MLP branches are dropped
    with this probability (kept ones scaled by ``1 / (1 - drop_path)``), as
    PTv3's stochastic depth on its (N, C) features; eval mode keeps all.
    """

    def __init__(self, channels: int, num_heads: int, patch_size: int = 1024, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, cpe: bool = True, pre_norm: bool = True, drop_path: float = 0.0):
        super().__init__()
        if not 0.0 <= drop_path < 1.0:
            raise ValueError(f"drop_path must lie in [0, 1), got {drop_path}")
        self.drop_path = float(drop_path)
        if cpe:
            self.cpe = ConditionalPositionalEncoding(channels)
        self.norm1 = LayerNorm(channels)
        self.attn = SerializedAttention(channels, num_heads, patch_size, qkv_bias=qkv_bias)
        self.norm2 = LayerNorm(channels)
        self.mlp = MLP(channels, max(1, int(round(channels * mlp_ratio))))
        self.pre_norm = pre_norm

    def _residual(self, x, fn, norm):
        branch = fn(norm(x) if self.pre_norm else x).feats
        if self.training and self.drop_path > 0.0:
            branch = drop_rows(branch, self.drop_path)
        y = x.replace(x.feats + branch)
        return y if self.pre_norm else norm(y)

    def __call__(self, x: SparseTensor, order=None, curve: str = "z") -> SparseTensor:
        if "cpe" in self:
            x = self.cpe(x)
        x = self._residual(x, lambda t: self.attn(t, order, curve), self.norm1)
        return self._residual(x, self.mlp, self.norm2)


__all__ = ["SerializedAttention", "TransformerBlock", "ConditionalPositionalEncoding", "MLP", "patch_layout",
           "patch_attention"]
