"""Point Transformer V3 (Wu et al., 2024) on sparse voxels, kept small.

Layout, for ``S`` encoder stages:

- embedding: a submanifold convolution (kernel 5), batch norm, GELU;
- encoder stage ``s``: for ``s > 0`` a serialized grid pooling (Linear, max
  over each 2x2x2 cell, batch norm, GELU), then ``enc_depths[s]``
  :class:`~mlx_lattice.nn.TransformerBlock` s;
- decoder stage ``s`` (``S - 2`` down to 0): unpooling onto encoder stage
  ``s``'s voxels (each voxel adds its coarse parent's projected features to
  its own projected skip features), then ``dec_depths[s]`` blocks;
- an optional linear head (per-voxel logits).

Each stage serializes its voxels along every curve of ``orders`` (codes of
that stage's coordinates at depth ``MAX_DEPTH``,
:mod:`mlx_lattice.serialization`); block ``i`` of
a stage attends along curve ``i % len(orders)``. In training mode the curve
list is shuffled per stage and call (``mx.random``, so ``mx.random.seed``
fixes it), as PTv3's order shuffling does; eval mode keeps the given order.
``drop_path`` (stochastic depth) rises linearly from 0 to its value over the
encoder's blocks in order, and over the decoder's from the finest stage's
last block (0) to the coarsest stage's first block, as in PTv3.
"""

from __future__ import annotations

import numpy as np
import mlx.core as mx
import mlx.nn as mnn

from .. import nn
from ..pooling import max_pool3d
from ..serialization import CURVES, MAX_DEPTH, serialization_order
from ..tensor import SparseTensor


class SerializedPooling(mnn.Module):
    """Linear projection, max over each ``stride``-cube of voxels (grid
    pooling: output voxel ``floor(p / stride)``), batch norm, GELU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 2):
        super().__init__()
        self.proj = nn.Linear(in_channels, out_channels)
        self.norm = nn.BatchNorm(out_channels)
        self.act = nn.GELU()
        self.stride = stride

    def __call__(self, x: SparseTensor) -> SparseTensor:
        return self.act(self.norm(max_pool3d(self.proj(x), self.stride, self.stride)))


def parent_rows(fine: SparseTensor, coarse: SparseTensor) -> mx.array:
    """Row in ``coarse`` of each ``fine`` voxel's enclosing coarse voxel."""
    ratio = [c // f for c, f in zip(coarse.stride, fine.stride)]
    if any(c % f for c, f in zip(coarse.stride, fine.stride)):
        raise ValueError(f"coarse stride {coarse.stride} is not a multiple of fine stride {fine.stride}")
    c = np.array(fine.coords).astype(np.int64).reshape(-1, 4)
    parent = np.concatenate([c[:, :1], c[:, 1:] // np.array(ratio)], axis=1).astype(np.int32)
    if len(parent) == 0:
        return mx.zeros((0,), dtype=mx.int32)
    rows = np.array(coarse.coordinate_set.table.lookup(mx.array(parent))).astype(np.int64)
    if (rows < 0).any():
        raise ValueError("some fine voxels have no enclosing voxel in the coarse tensor")
    return mx.array(rows.astype(np.int32))


class SerializedUnpooling(mnn.Module):
    """Back onto the skip tensor's voxels: ``proj_skip(skip) + proj(coarse)[parent]``,
    each projection a Linear, batch norm and GELU."""

    def __init__(self, in_channels: int, skip_channels: int, out_channels: int):
        super().__init__()
        self.proj = nn.Sequential(nn.Linear(in_channels, out_channels), nn.BatchNorm(out_channels), nn.GELU())
        self.proj_skip = nn.Sequential(nn.Linear(skip_channels, out_channels), nn.BatchNorm(out_channels), nn.GELU())

    def __call__(self, coarse: SparseTensor, skip: SparseTensor) -> SparseTensor:
        rows = parent_rows(skip, coarse)
        s = self.proj_skip(skip)
        return s.replace(s.feats + self.proj(coarse).feats[rows])


def _per_stage(value, n: int, name: str) -> tuple:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * n
    value = tuple(value)
    if len(value) != n:
        raise ValueError(f"{name} needs {n} entries, got {len(value)}")
    return value


class PointTransformerV3(mnn.Module):
    """``PointTransformerV3(in_channels, num_classes=None, ...)``.

    Calling it on a SparseTensor returns a SparseTensor on the input's rows:
    per-voxel logits ``(N, num_classes)``, or the last decoder stage's
    features ``(N, dec_channels[0])`` without a head. Defaults give a
    three-stage network (the published model has five, with channels up to
    512); every size is an argument. ``patch_size``: an int or one per
    encoder stage (decoder stage ``s`` uses encoder stage ``s``'s).
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int | None = None,
        *,
        enc_channels=(32, 64, 128),
        enc_depths=(2, 2, 2),
        enc_heads=(2, 4, 8),
        dec_channels=(32, 64),
        dec_depths=(1, 1),
        dec_heads=(2, 4),
        patch_size=1024,
        mlp_ratio: float = 4.0,
        orders=("z", "z-trans", "hilbert", "hilbert-trans"),
        shuffle_orders: bool = True,
        stem_kernel: int = 5,
        drop_path: float = 0.0,
    ):
        super().__init__()
        s = len(enc_channels)
        if s < 1 or len(enc_depths) != s or len(enc_heads) != s:
            raise ValueError("enc_channels, enc_depths and enc_heads need one entry per stage")
        if len(dec_channels) != s - 1 or len(dec_depths) != s - 1 or len(dec_heads) != s - 1:
            raise ValueError(f"dec_channels, dec_depths and dec_heads need {s - 1} entries (stages - 1)")
        orders = tuple(orders)
        if not orders or any(o not in CURVES for o in orders):
            raise ValueError(f"orders must be a non-empty sequence of {list(CURVES)}, got {orders}")
        patch = _per_stage(patch_size, s, "patch_size")
        self.orders = orders
        self.shuffle_orders = shuffle_orders

        self.embedding = nn.Sequential(
            nn.SubmConv3d(in_channels, enc_channels[0], stem_kernel, bias=False),
            nn.BatchNorm(enc_channels[0]),
            nn.GELU(),
        )
        self.down = [SerializedPooling(enc_channels[i - 1], enc_channels[i]) for i in range(1, s)]
        # Stochastic depth grows linearly with depth: over the encoder blocks,
        # and again over the decoder blocks from the coarsest stage up.
        enc_rates = iter(np.linspace(0.0, drop_path, sum(enc_depths)).tolist())
        dec_rates = np.linspace(0.0, drop_path, sum(dec_depths)).tolist()
        self.enc = [
            [
                nn.TransformerBlock(enc_channels[i], enc_heads[i], patch[i], mlp_ratio, drop_path=next(enc_rates))
                for _ in range(enc_depths[i])
            ]
            for i in range(s)
        ]
        self.up = []
        self.dec = []
        for i in range(s - 1):
            below = enc_channels[s - 1] if i == s - 2 else dec_channels[i + 1]
            self.up.append(SerializedUnpooling(below, enc_channels[i], dec_channels[i]))
            first = sum(dec_depths[:i])
            rates = dec_rates[first:first + dec_depths[i]][::-1]
            self.dec.append(
                [nn.TransformerBlock(dec_channels[i], dec_heads[i], patch[i], mlp_ratio, drop_path=r) for r in rates]
            )
        out_channels = dec_channels[0] if s > 1 else enc_channels[0]
        if num_classes is not None:
            self.head = nn.Linear(out_channels, num_classes)

    def _serialize(self, x: SparseTensor) -> list[np.ndarray]:
        curves = list(self.orders)
        if self.training and self.shuffle_orders and len(curves) > 1:
            perm = np.array(mx.random.permutation(len(curves))).tolist()
            curves = [curves[k] for k in perm]
        # A fixed depth: an item's Hilbert order then ignores its batch mates' extent.
        return [serialization_order(x.coords, c, depth=MAX_DEPTH)[0] for c in curves]

    def _stage(self, blocks, x: SparseTensor) -> SparseTensor:
        if not blocks:
            return x
        orders = self._serialize(x)
        for i, block in enumerate(blocks):
            x = block(x, orders[i % len(orders)])
        return x

    def features(self, x: SparseTensor) -> SparseTensor:
        if not isinstance(x, SparseTensor):
            raise TypeError(f"PointTransformerV3 needs a SparseTensor, got {type(x).__name__}")
        x = self.embedding(x)
        skips = []
        for i, blocks in enumerate(self.enc):
            if i > 0:
                x = self.down[i - 1](x)
            x = self._stage(blocks, x)
            skips.append(x)
        x = skips.pop()
        for i in reversed(range(len(self.dec))):
            x = self._stage(self.dec[i], self.up[i](x, skips.pop()))
        return x

    def __call__(self, x: SparseTensor) -> SparseTensor:
        y = self.features(x)
        return self.head(y) if "head" in self else y
