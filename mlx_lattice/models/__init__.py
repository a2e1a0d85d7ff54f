"""Reference networks built from :mod:`mlx_lattice.nn`."""

from .autoencoder import DecoderLevel, SparseVoxelAutoencoder
from .minkunet import ConvBlock, DeconvBlock, MinkUNet, ResidualBlock
from .ptv3 import PointTransformerV3, SerializedPooling, SerializedUnpooling

__all__ = [
    "MinkUNet",
    "ConvBlock",
    "DeconvBlock",
    "ResidualBlock",
    "SparseVoxelAutoencoder",
    "DecoderLevel",
    "PointTransformerV3",
    "SerializedPooling",
    "SerializedUnpooling",
]
