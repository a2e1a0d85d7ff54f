"""Layers for sparse networks, in the style of ``mlx.nn``.

Modules take and return :class:`mlx_lattice.SparseTensor` (global pooling
returns a dense ``(B, C)`` array), keep their parameters as attributes, and
compose with ``mlx.nn.Sequential`` (re-exported here), ``save_weights`` /
``load_weights``, ``mlx.optimizers`` and ``mx.compile``.
"""

from mlx.nn import Identity, Module, Sequential

from .activations import GELU, Dropout, FeatureMap, LeakyReLU, ReLU, Sigmoid, SiLU, Tanh
from .convolution import Conv3d, ConvTranspose3d, GenerativeConvTranspose3d, Linear, SubmConv3d
from .normalization import BatchNorm, InstanceNorm, LayerNorm, RMSNorm
from .sync_batch_norm import SyncBatchNorm, convert_sync_batchnorm
from .pooling import AvgPool3d, GlobalAvgPool, GlobalMaxPool, GlobalSumPool, MaxPool3d, SumPool3d
from .quantized import (
    QuantizedConv3d,
    QuantizedConvTranspose3d,
    QuantizedGenerativeConvTranspose3d,
    QuantizedSubmConv3d,
    from_module,
    quantize,
)

__all__ = [
    "Module",
    "Sequential",
    "Identity",
    "Conv3d",
    "SubmConv3d",
    "ConvTranspose3d",
    "GenerativeConvTranspose3d",
    "Linear",
    "BatchNorm",
    "SyncBatchNorm",
    "convert_sync_batchnorm",
    "InstanceNorm",
    "LayerNorm",
    "RMSNorm",
    "ReLU",
    "LeakyReLU",
    "GELU",
    "SiLU",
    "Sigmoid",
    "Tanh",
    "Dropout",
    "FeatureMap",
    "MaxPool3d",
    "AvgPool3d",
    "SumPool3d",
    "GlobalMaxPool",
    "GlobalAvgPool",
    "GlobalSumPool",
    "QuantizedConv3d",
    "QuantizedSubmConv3d",
    "QuantizedConvTranspose3d",
    "QuantizedGenerativeConvTranspose3d",
    "from_module",
    "quantize",
]
