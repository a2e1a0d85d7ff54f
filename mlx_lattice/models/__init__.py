"""Reference networks built from :mod:`mlx_lattice.nn`."""

from .autoencoder import DecoderLevel, SparseVoxelAutoencoder
from .minkunet import ConvBlock, DeconvBlock, MinkUNet, ResidualBlock

__all__ = [
    "MinkUNet",
    "ConvBlock",
    "DeconvBlock",
    "ResidualBlock",
    "SparseVoxelAutoencoder",
    "DecoderLevel",
]
