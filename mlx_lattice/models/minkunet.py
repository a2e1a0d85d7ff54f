"""MinkUNet: the sparse residual U-Net of the TorchSparse / SPVNAS papers.

Layout (channels ``[32, 32, 64, 128, 256, 256, 128, 96, 96]`` times ``width``):

- stem: two 3x3x3 convolutions (submanifold) with batch norm and ReLU;
- four encoder stages, each a 2x2x2 stride-2 convolution block followed by
  two residual blocks (the first changes the channel count);
- four decoder stages, each a 2x2x2 stride-2 transposed convolution block
  back onto the matching encoder voxels, concatenation with that encoder
  stage's features (skip connection), and two residual blocks;
- a linear classifier on every voxel.

The 0.5x and 1.0x widths are the ones evaluated in the TorchSparse papers.
Each batch norm runs fused with its ReLU (and the residual add) through
:func:`mlx_lattice.nn.norm_act`; a tensor that feeds two layers (block
inputs, skip connections) goes through :func:`mlx_lattice.algebra.fork`.
"""

from __future__ import annotations

import mlx.nn as mnn

from .. import algebra
from .. import nn
from ..tensor import SparseTensor

BASE_CHANNELS = (32, 32, 64, 128, 256, 256, 128, 96, 96)


class ConvBlock(mnn.Module):
    """Convolution, batch norm, ReLU. Submanifold when stride is 1 and the
    kernel is odd (the support is kept), a strided convolution otherwise."""

    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, dilation=1):
        super().__init__()
        if stride == 1 and kernel_size % 2 == 1:
            self.conv = nn.SubmConv3d(in_channels, out_channels, kernel_size, dilation=dilation, bias=False)
        else:
            self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, stride=stride, dilation=dilation, bias=False)
        self.norm = nn.BatchNorm(out_channels)
        self.act = nn.ReLU()

    def __call__(self, x: SparseTensor) -> SparseTensor:
        return nn.norm_act(self.norm, self.conv(x), self.act)


class DeconvBlock(mnn.Module):
    """Transposed convolution (onto the encoder voxels), batch norm, ReLU."""

    def __init__(self, in_channels, out_channels, kernel_size=2, stride=2):
        super().__init__()
        self.conv = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride, bias=False)
        self.norm = nn.BatchNorm(out_channels)
        self.act = nn.ReLU()

    def __call__(self, x: SparseTensor) -> SparseTensor:
        return nn.norm_act(self.norm, self.conv(x), self.act)


class ResidualBlock(mnn.Module):
    """Two 3x3x3 submanifold convolutions with batch norm, plus a shortcut
    (identity, or a 1x1x1 convolution with batch norm when the channel count
    changes), then ReLU."""

    def __init__(self, in_channels, out_channels, kernel_size=3, dilation=1):
        super().__init__()
        self.conv1 = nn.SubmConv3d(in_channels, out_channels, kernel_size, dilation=dilation, bias=False)
        self.norm1 = nn.BatchNorm(out_channels)
        self.conv2 = nn.SubmConv3d(out_channels, out_channels, kernel_size, dilation=dilation, bias=False)
        self.norm2 = nn.BatchNorm(out_channels)
        if in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Linear(in_channels, out_channels, bias=False), nn.BatchNorm(out_channels))
        else:
            self.shortcut = nn.Identity()
        self.act = nn.ReLU()

    def __call__(self, x: SparseTensor) -> SparseTensor:
        x, shortcut = algebra.fork(x)
        h = nn.norm_act(self.norm1, self.conv1(x), self.act)
        return nn.norm_act(self.norm2, self.conv2(h), self.act, residual=self.shortcut(shortcut))


class MinkUNet(mnn.Module):
    """Sparse residual U-Net for per-voxel classification.

    ``MinkUNet(in_channels, num_classes, width=1.0)``; calling it on a
    :class:`SparseTensor` returns per-voxel logits ``(N, num_classes)`` as a
    SparseTensor on the input's voxels (same rows, same order). The input
    needs no particular stride or extent; each stage halves the resolution,
    so four stages see a 16x coarser grid.
    """

    def __init__(self, in_channels: int, num_classes: int, width: float = 1.0):
        super().__init__()
        cs = [max(1, int(round(width * c))) for c in BASE_CHANNELS]
        self.channels = tuple(cs)
        self.stem = nn.Sequential(ConvBlock(in_channels, cs[0]), ConvBlock(cs[0], cs[0]))
        self.encoder = [
            nn.Sequential(
                ConvBlock(cs[i], cs[i], kernel_size=2, stride=2),
                ResidualBlock(cs[i], cs[i + 1]),
                ResidualBlock(cs[i + 1], cs[i + 1]),
            )
            for i in range(4)
        ]
        self.up = []
        self.decoder = []
        prev = cs[4]
        for j in range(4):
            out, skip = cs[5 + j], cs[3 - j]
            self.up.append(DeconvBlock(prev, out))
            self.decoder.append(nn.Sequential(ResidualBlock(out + skip, out), ResidualBlock(out, out)))
            prev = out
        self.classifier = nn.Linear(cs[8], num_classes)

    def features(self, x: SparseTensor) -> SparseTensor:
        """The last decoder stage's features (before the classifier)."""
        skips = []
        y = self.stem(x)
        for stage in self.encoder:
            y, skip = algebra.fork(y)
            skips.append(skip)
            y = stage(y)
        for up, dec in zip(self.up, self.decoder):
            y = dec(algebra.cat([up(y), skips.pop()]))
        return y

    def __call__(self, x: SparseTensor) -> SparseTensor:
        return self.classifier(self.features(x))
