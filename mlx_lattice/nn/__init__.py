"""Layers for sparse networks, in the style of ``mlx.nn``.

Modules take and return :class:`mlx_lattice.SparseTensor` (global pooling
returns a dense ``(B, C)`` array), keep their parameters as attributes, and
compose with ``mlx.nn.Sequential`` (re-exported here), ``save_weights`` /
``load_weights``, ``mlx.optimizers`` and ``mx.compile``.
"""

from mlx.nn import Identity, Module, Sequential

from .activations import GELU, Dropout, FeatureMap, LeakyReLU, ReLU, Sigmoid, SiLU, Softplus, Tanh
from .attention import MLP, ConditionalPositionalEncoding, SerializedAttention, TransformerBlock
from .convolution import Conv3d, ConvTranspose3d, GenerativeConvTranspose3d, Linear, SubmConv3d
from .decoder import Downsample, Expand, PoolTranspose3d, Prune, Upsample
from .group_norm import GroupNorm
from .normalization import BatchNorm, InstanceNorm, LayerNorm, RMSNorm, norm_act
from .sync_batch_norm import SyncBatchNorm, convert_sync_batchnorm
from .pooling import AvgPool3d, GlobalAvgPool, GlobalMaxPool, GlobalSumPool, MaxPool3d, SumPool3d
from .quantized import (
    QuantizedConv3d,
    QuantizedConvTranspose3d,
    QuantizedGenerativeConvTranspose3d,
    QuantizedLinear,
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
    "GroupNorm",
    "norm_act",
    "ReLU",
    "LeakyReLU",
    "GELU",
    "SiLU",
    "Sigmoid",
    "Tanh",
    "Softplus",
    "Dropout",
    "FeatureMap",
    "MaxPool3d",
    "AvgPool3d",
    "SumPool3d",
    "GlobalMaxPool",
    "GlobalAvgPool",
    "GlobalSumPool",
    "PoolTranspose3d",
    "Upsample",
    "Expand",
    "Downsample",
    "Prune",
    "SerializedAttention",
    "TransformerBlock",
    "ConditionalPositionalEncoding",
    "MLP",
    "QuantizedConv3d",
    "QuantizedSubmConv3d",
    "QuantizedConvTranspose3d",
    "QuantizedGenerativeConvTranspose3d",
    "QuantizedLinear",
    "from_module",
    "quantize",
]
