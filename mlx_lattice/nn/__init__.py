"""Layers for sparse networks, in the style of ``mlx.nn``.

Modules take and return :class:`mlx_lattice.SparseTensor` (global pooling
returns a dense ``(B, C)`` array), keep their parameters as attributes, and
compose with ``mlx.nn.Sequential`` (``Sequential`` here is the same, and
names an ``mlx.nn`` array layer handed a SparseTensor), ``save_weights`` /
``load_weights``, ``mlx.optimizers`` and ``mx.compile``. ``mlx.nn``'s own
layers take arrays, not SparseTensors: use the layer of the same name here,
or ``FeatureMap(layer)``. ``docs/nn.md`` lists every layer.
"""

from mlx.nn import Identity, Module

from .container import Sequential

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
    QuantizationPlan,
    QuantizationWarning,
    from_module,
    quantization_plan,
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
    "quantization_plan",
    "QuantizationPlan",
    "QuantizationWarning",
]
