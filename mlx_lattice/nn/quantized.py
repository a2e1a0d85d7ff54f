"""Quantized sparse convolution layers (inference), in the style of
``mlx.nn.QuantizedLinear``: the weight is kept as MLX affine codes
(``weight`` uint32, ``scales``, ``biases``) and the layer is frozen.

``mlx_lattice.nn.quantize(model, bits, group_size)`` swaps every sparse
convolution and :class:`Linear` whose input channels divide into groups for
its quantized form;
``mlx.nn.quantize`` works as well, through each layer's ``to_quantized``.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as mnn

from .. import backends, ops
from ..quantized import QuantizedWeight
from ..tensor import SparseTensor
from .convolution import Conv3d, ConvTranspose3d, GenerativeConvTranspose3d, Linear, SubmConv3d, _ConvBase


class _QuantizedConvBase(mnn.Module):
    def __init__(self, conv: _ConvBase, bits: int = 4, group_size: int = 64):
        super().__init__()
        q = QuantizedWeight.from_float(conv.weight, bits=bits, group_size=group_size)
        self.weight, self.scales, self.biases = q.codes, q.scales, q.biases
        if "bias" in conv:
            self.bias = conv.bias
        self.bits, self.group_size = bits, group_size
        self.kernel_size, self.stride = conv.kernel_size, conv.stride
        self.padding, self.dilation = conv.padding, conv.dilation
        self.freeze()

    @classmethod
    def from_float(cls, conv: _ConvBase, bits: int = 4, group_size: int = 64):
        """The quantized form of a float layer of the matching kind."""
        if not isinstance(conv, cls._float_class):
            raise TypeError(f"{cls.__name__}.from_float needs a {cls._float_class.__name__}, got {type(conv).__name__}")
        return cls(conv, bits, group_size)

    def quantized_weight(self) -> QuantizedWeight:
        return QuantizedWeight(self.weight, self.scales, self.biases, bits=self.bits, group_size=self.group_size)

    def _extra_repr(self):
        c_out = self.weight.shape[0]
        c_in = self.weight.shape[-1] * 32 // self.bits
        return f"{c_in}, {c_out}, kernel_size={self.kernel_size}, bits={self.bits}, group_size={self.group_size}"


class QuantizedConv3d(_QuantizedConvBase):
    _float_class = Conv3d

    def __call__(self, x, coordinates=None):
        return ops.conv3d(
            x, self.quantized_weight(), self.get("bias"), stride=self.stride, padding=self.padding,
            dilation=self.dilation, coordinates=coordinates,
        )


class QuantizedSubmConv3d(_QuantizedConvBase):
    _float_class = SubmConv3d

    def __call__(self, x):
        return ops.subm_conv3d(x, self.quantized_weight(), self.get("bias"), dilation=self.dilation)


class QuantizedConvTranspose3d(_QuantizedConvBase):
    _float_class = ConvTranspose3d

    def __call__(self, x, coordinates=None):
        return ops.conv_transpose3d(
            x, self.quantized_weight(), self.get("bias"), stride=self.stride, padding=self.padding,
            dilation=self.dilation, coordinates=coordinates,
        )


class QuantizedGenerativeConvTranspose3d(_QuantizedConvBase):
    _float_class = GenerativeConvTranspose3d

    def __call__(self, x):
        return ops.generative_conv_transpose3d(
            x, self.quantized_weight(), self.get("bias"), stride=self.stride, padding=self.padding,
            dilation=self.dilation,
        )


class QuantizedLinear(mnn.Module):
    """:class:`Linear` with int4/int8 weights: ``weight`` uint32 codes
    ``(C_out, C_in * bits / 32)``, ``scales`` and ``biases``
    ``(C_out, C_in / group_size)``, exactly ``mx.quantize`` of the float
    ``(C_out, C_in)`` weight (the layout of ``mlx.nn.QuantizedLinear``, so
    its parameters load unchanged). On a SparseTensor it runs the quantized
    pointwise convolution (rows and coordinate set kept); a plain
    ``(..., C_in)`` array gets ``mx.quantized_matmul``. Frozen: inference.
    """

    def __init__(self, linear: Linear, bits: int = 4, group_size: int = 64):
        super().__init__()
        if not isinstance(linear, Linear):
            raise TypeError(f"QuantizedLinear needs a Linear, got {type(linear).__name__}")
        c_out, c_in = linear.weight.shape
        q = QuantizedWeight.from_float(linear.weight.reshape(c_out, 1, 1, 1, c_in), bits=bits, group_size=group_size)
        self.weight = q.codes.reshape(c_out, -1)
        self.scales = q.scales.reshape(c_out, -1)
        self.biases = q.biases.reshape(c_out, -1)
        if "bias" in linear:
            self.bias = linear.bias
        self.bits, self.group_size = bits, group_size
        self.freeze()

    @classmethod
    def from_float(cls, linear: Linear, bits: int = 4, group_size: int = 64) -> "QuantizedLinear":
        return cls(linear, bits, group_size)

    def quantized_weight(self) -> QuantizedWeight:
        """The codes as a 1x1x1 convolution weight ``(C_out, 1, 1, 1, C_in)``."""
        c_out = self.weight.shape[0]
        return QuantizedWeight(
            self.weight.reshape(c_out, 1, 1, 1, -1), self.scales.reshape(c_out, 1, 1, 1, -1),
            self.biases.reshape(c_out, 1, 1, 1, -1), bits=self.bits, group_size=self.group_size,
        )

    def _extra_repr(self):
        c_out = self.weight.shape[0]
        c_in = self.weight.shape[1] * 32 // self.bits
        return f"input_dims={c_in}, output_dims={c_out}, bias={'bias' in self}, bits={self.bits}, group_size={self.group_size}"

    def __call__(self, x):
        if isinstance(x, SparseTensor):
            return ops.conv3d(x, self.quantized_weight(), self.get("bias"))
        if self.scales.shape[-1] == 1 and _cuda_default():
            # MLX 0.32's CUDA quantized_matmul returns wrong values when a
            # row holds a single group (C_in == group_size) and x has more
            # than one row; the dequantized product is exact to rounding.
            w = mx.dequantize(self.weight, self.scales, self.biases, group_size=self.group_size, bits=self.bits)
            y = x @ w.astype(x.dtype).T
        else:
            y = mx.quantized_matmul(
                x, self.weight, self.scales, self.biases, transpose=True, group_size=self.group_size,
                bits=self.bits,
            )
        return y + self.bias if "bias" in self else y


def _cuda_default() -> bool:
    return backends.current().name == "cuda"


# Most specific classes first (SubmConv3d etc. are not subclasses of Conv3d,
# but keep the order meaningful if that changes).
_QUANTIZED = (
    (SubmConv3d, QuantizedSubmConv3d),
    (GenerativeConvTranspose3d, QuantizedGenerativeConvTranspose3d),
    (ConvTranspose3d, QuantizedConvTranspose3d),
    (Conv3d, QuantizedConv3d),
    (Linear, QuantizedLinear),
)


def from_module(conv, bits: int = 4, group_size: int = 64):
    """The quantized layer for any sparse convolution layer or :class:`Linear`."""
    if getattr(conv, "groups", 1) > 1:
        raise ValueError(
            f"{type(conv).__name__} has groups={conv.groups}; grouped convolutions stay float"
        )
    for float_cls, q_cls in _QUANTIZED:
        if isinstance(conv, float_cls):
            return q_cls(conv, bits, group_size)
    raise TypeError(f"no quantized form for {type(conv).__name__}")


def _to_quantized(self, group_size: int = None, bits: int = None, mode: str = "affine", **kwargs):
    if mode != "affine":
        raise ValueError(f"sparse convolutions support affine quantization only, got mode={mode!r}")
    return from_module(self, bits=bits or 4, group_size=group_size or 64)


_ConvBase.to_quantized = _to_quantized
Linear.to_quantized = _to_quantized


def quantize(model: mnn.Module, bits: int = 4, group_size: int = 64) -> mnn.Module:
    """Quantize, in place, every sparse convolution and Linear of ``model`` whose input
    channels are a multiple of ``group_size`` (others, e.g. a stem reading a
    handful of point features, and grouped convolutions, stay float). Returns
    the model."""

    def predicate(_, m):
        return (
            isinstance(m, (_ConvBase, Linear))
            and getattr(m, "groups", 1) == 1
            and m.weight.shape[-1] % group_size == 0
        )

    mnn.quantize(model, group_size=group_size, bits=bits, class_predicate=predicate)
    return model
