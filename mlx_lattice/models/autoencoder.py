"""A small sparse-voxel autoencoder with a generative decoder.

The encoder halves the resolution at each level with strided sparse
convolutions down to a coarse latent. The decoder grows the voxel set back:
at each level a :class:`~mlx_lattice.nn.GenerativeConvTranspose3d` (kernel 2,
stride 2) proposes all 8 children of every voxel, a linear head scores each
child's occupancy, and the children judged empty are pruned. In training the
pruning follows the encoder's voxels at that level (teacher forcing, as in
generative sparse detection and sparse-voxel VAEs), so every level gets
occupancy targets; at inference it follows the predicted logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import mlx.core as mx
import mlx.nn as mnn

from .. import algebra, nn
from ..manager import CoordinateSet
from ..tensor import SparseTensor
from .minkunet import ConvBlock


@dataclass
class DecoderLevel:
    """One decoder level: occupancy logits of the proposed voxels (a
    SparseTensor with one channel) and, when the target voxels are known,
    which proposals are occupied ((M,) bool NumPy)."""

    logits: SparseTensor
    target: np.ndarray | None


class SparseVoxelAutoencoder(mnn.Module):
    """Occupancy autoencoder for voxel sets.

    ``channels`` lists the feature widths from the finest level to the
    coarsest; the latent lies ``2 ** (len(channels) - 1)`` times coarser than
    the input, with ``latent_channels`` features per voxel.

    ``model(x)`` encodes ``x`` and decodes with teacher forcing, returning
    ``(reconstruction, levels)``; :meth:`loss` is the mean binary cross
    entropy of the occupancy logits over the levels; :meth:`reconstruct`
    decodes from the logits alone.
    """

    def __init__(self, in_channels: int = 1, channels=(16, 32, 64), latent_channels: int = 8):
        super().__init__()
        channels = tuple(int(c) for c in channels)
        if len(channels) < 2:
            raise ValueError("channels needs at least two levels")
        self.channels = channels
        self.stem = ConvBlock(in_channels, channels[0])
        self.down = [
            nn.Sequential(ConvBlock(channels[i], channels[i + 1], 2, stride=2), ConvBlock(channels[i + 1], channels[i + 1]))
            for i in range(len(channels) - 1)
        ]
        self.to_latent = nn.Linear(channels[-1], latent_channels)
        self.from_latent = nn.Sequential(
            nn.Linear(latent_channels, channels[-1]), nn.BatchNorm(channels[-1]), nn.ReLU()
        )
        self.up = []
        self.occupancy = []
        for i in reversed(range(len(channels) - 1)):
            self.up.append(
                nn.Sequential(
                    nn.GenerativeConvTranspose3d(channels[i + 1], channels[i], 2, stride=2, bias=False),
                    nn.BatchNorm(channels[i]),
                    nn.ReLU(),
                    ConvBlock(channels[i], channels[i]),
                )
            )
            self.occupancy.append(nn.Linear(channels[i], 1))

    def _encode(self, x: SparseTensor):
        h = self.stem(x)
        sets = [h.coordinate_set]
        for stage in self.down:
            h = stage(h)
            sets.append(h.coordinate_set)
        return self.to_latent(h), sets

    def encode(self, x: SparseTensor) -> SparseTensor:
        """The latent: ``x`` at ``2 ** (levels - 1)`` times coarser resolution."""
        return self._encode(x)[0]

    def decode(self, z: SparseTensor, targets: list[CoordinateSet] | None = None):
        """Grow voxels from the latent ``z``; returns ``(voxels, levels)``.

        ``targets``: the voxel sets to keep at each level, finest last (from
        the encoder); without them a proposal is kept when its logit is > 0.
        ``voxels`` carries the finest level's features.
        """
        h = self.from_latent(z)
        levels = []
        for j, (up, occ) in enumerate(zip(self.up, self.occupancy)):
            h = up(h)
            logits = occ(h)
            if targets is not None:
                found = np.array(targets[j].table.lookup(h.coords)) >= 0
                keep = found
            else:
                found = None
                keep = np.array(logits.feats[:, 0] > 0)
            levels.append(DecoderLevel(logits, found))
            h = algebra.prune(h, keep)
        return h, levels

    def __call__(self, x: SparseTensor):
        z, sets = self._encode(x)
        # Targets finest last: the encoder's sets from the second coarsest down.
        return self.decode(z, targets=sets[-2::-1])

    def loss(self, x: SparseTensor) -> mx.array:
        """Mean over levels of the binary cross entropy of the occupancy logits."""
        _, levels = self(x)
        total = mx.array(0.0)
        for level in levels:
            target = mx.array(level.target.astype(np.float32))
            total = total + mnn.losses.binary_cross_entropy(
                level.logits.feats[:, 0].astype(mx.float32), target, with_logits=True, reduction="mean"
            )
        return total / len(levels)

    def reconstruct(self, x: SparseTensor) -> SparseTensor:
        """Encode, then decode from the predicted occupancy alone."""
        return self.decode(self.encode(x))[0]
