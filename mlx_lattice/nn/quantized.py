"""Quantized sparse convolution layers (inference), in the style of
``mlx.nn.QuantizedLinear``: the weight is kept as MLX affine codes
(``weight`` uint32, ``scales``, ``biases``) and the layer is frozen.

``mlx_lattice.nn.quantize(model, bits, group_size)`` swaps every sparse
convolution and :class:`Linear` whose input channels divide into groups for
its quantized form, warns naming each layer it leaves float and why, and
raises when it would quantize nothing; ``quantization_plan`` says the same
without changing the model. ``group_size=None`` (the default) takes 64 where
it divides a layer's input channels, else 32. ``mlx.nn.quantize`` works as
well, through each layer's ``to_quantized``. ``docs/quantization.md``.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as mnn
from mlx.utils import tree_unflatten

from .. import backends, ops
from ..quantized import BITS, GROUP_SIZES, QuantizedWeight, default_group_size, unquantizable_reason
from ..tensor import SparseTensor
from .convolution import Conv3d, ConvTranspose3d, GenerativeConvTranspose3d, Linear, SubmConv3d, _ConvBase


class _QuantizedConvBase(mnn.Module):
    def __init__(self, conv: _ConvBase, bits: int = 4, group_size: int | None = None):
        super().__init__()
        q = QuantizedWeight.from_float(conv.weight, bits=bits, group_size=group_size)
        self.weight, self.scales, self.biases = q.codes, q.scales, q.biases
        if "bias" in conv:
            self.bias = conv.bias
        self.bits, self.group_size = bits, q.group_size
        self.kernel_size, self.stride = conv.kernel_size, conv.stride
        self.padding, self.dilation = conv.padding, conv.dilation
        self.freeze()

    @classmethod
    def from_float(cls, conv: _ConvBase, bits: int = 4, group_size: int | None = None):
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

    def __init__(self, linear: Linear, bits: int = 4, group_size: int | None = None):
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
        self.bits, self.group_size = bits, q.group_size
        self.freeze()

    @classmethod
    def from_float(cls, linear: Linear, bits: int = 4, group_size: int | None = None) -> "QuantizedLinear":
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
        if self.scales.shape[-1] == 1 and not backends.current().quantized_matmul_single_group_exact:
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


# Most specific classes first (SubmConv3d etc. are not subclasses of Conv3d,
# but keep the order meaningful if that changes).
_QUANTIZED = (
    (SubmConv3d, QuantizedSubmConv3d),
    (GenerativeConvTranspose3d, QuantizedGenerativeConvTranspose3d),
    (ConvTranspose3d, QuantizedConvTranspose3d),
    (Conv3d, QuantizedConv3d),
    (Linear, QuantizedLinear),
)


def from_module(conv, bits: int = 4, group_size: int | None = None):
    """The quantized layer for any sparse convolution layer or :class:`Linear`
    (``group_size=None``: 64 where it divides C_in, else 32)."""
    if getattr(conv, "groups", 1) > 1:
        raise ValueError(
            f"{type(conv).__name__} has groups={conv.groups}; grouped convolutions stay float"
        )
    for float_cls, q_cls in _QUANTIZED:
        if isinstance(conv, float_cls):
            return q_cls(conv, bits, group_size)
    raise TypeError(f"no quantized form for {type(conv).__name__}")


def _to_quantized(self, group_size: int = None, bits: int = None, mode: str = "affine", **kwargs):
    # mlx.nn.quantize's hook. A layer that cannot be quantized raises (as
    # MLX's own layers do); mlx_lattice.nn.quantize leaves such layers float
    # and reports them instead.
    if mode != "affine":
        raise ValueError(f"sparse convolutions support affine quantization only, got mode={mode!r}")
    try:
        return from_module(self, bits=bits or 4, group_size=group_size)
    except ValueError as e:
        raise ValueError(
            f"{e} ({type(self).__name__}.to_quantized); mlx_lattice.nn.quantize(model) leaves such layers "
            f"float and names them"
        ) from None


_ConvBase.to_quantized = _to_quantized
Linear.to_quantized = _to_quantized


class QuantizationWarning(UserWarning):
    """``nn.quantize`` left some convolution or Linear layers float."""


@dataclass(frozen=True)
class LayerDecision:
    """What ``quantize`` does with one convolution or Linear layer."""

    path: str  # the layer's name in the model ("" for the model itself)
    kind: str  # its class name
    c_in: int
    group_size: int | None  # the group size it is quantized with; None when it stays float
    reason: str | None  # why it stays float

    @property
    def quantized(self) -> bool:
        return self.group_size is not None


class QuantizationPlan:
    """The layers ``quantize(model, bits, group_size)`` quantizes and those it
    leaves float, with the reason; ``str(plan)`` is a table."""

    def __init__(self, bits: int, group_size, layers, already_quantized):
        self.bits, self.group_size = bits, group_size
        self.layers: list[LayerDecision] = list(layers)
        self.already_quantized: list[str] = list(already_quantized)

    @property
    def quantized(self) -> list[LayerDecision]:
        return [d for d in self.layers if d.quantized]

    @property
    def skipped(self) -> list[LayerDecision]:
        return [d for d in self.layers if not d.quantized]

    def __str__(self) -> str:
        head = (f"quantize(bits={self.bits}, group_size={self.group_size}): {len(self.quantized)} of "
                f"{len(self.layers)} convolution/Linear layers quantized")
        rows = [head]
        for d in self.layers:
            what = f"int{self.bits}, group {d.group_size}" if d.quantized else f"float: {d.reason}"
            rows.append(f"  {d.path or '<model>'}  {d.kind}(C_in={d.c_in})  {what}")
        if self.already_quantized:
            rows.append(f"  already quantized: {', '.join(p or '<model>' for p in self.already_quantized)}")
        return "\n".join(rows)

    __repr__ = __str__


_LOG = logging.getLogger("mlx_lattice.quantize")


def _check_bits_group(bits, group_size):
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    if group_size is not None and group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES} or None (per layer: 64, else 32), got {group_size!r}")


def quantization_plan(model: mnn.Module, bits: int = 4, group_size: int | None = None) -> QuantizationPlan:
    """What :func:`quantize` would do to ``model``, without changing it: each
    sparse convolution and :class:`Linear`, quantized with which group size or
    left float and why."""
    if not isinstance(model, mnn.Module):
        raise TypeError(f"model must be an mlx.nn.Module, got {type(model).__name__}")
    _check_bits_group(bits, group_size)
    layers, already = [], []
    for path, m in model.named_modules():
        if isinstance(m, (_QuantizedConvBase, QuantizedLinear)):
            already.append(path)
            continue
        if not isinstance(m, (_ConvBase, Linear)):
            continue
        groups = getattr(m, "groups", 1)
        c_in = m.weight.shape[-1] * groups
        if groups > 1:
            reason = f"groups={groups}: grouped convolutions take float weights"
        else:
            reason = unquantizable_reason(c_in, group_size)
        g = None if reason else (group_size or default_group_size(c_in))
        layers.append(LayerDecision(path, type(m).__name__, c_in, g, reason))
    # named_modules lists the deepest layers last; report in model order
    layers.reverse()
    already.reverse()
    return QuantizationPlan(bits, group_size, layers, already)


def quantize(model: mnn.Module, bits: int = 4, group_size: int | None = None) -> mnn.Module:
    """Quantize, in place, every sparse convolution and Linear of ``model``
    that can be, and return the model.

    ``group_size=None`` picks per layer: 64 where it divides the layer's
    input channels, else 32. A given ``group_size`` applies to every layer
    whose input channels it divides. Layers left float (input channels that
    no group size divides, e.g. a stem reading a handful of point features or
    16 or 48 channels; grouped convolutions) are named, with the reason, in
    one :class:`QuantizationWarning`; a call that would quantize no layer
    raises ``ValueError``. :func:`quantization_plan` gives the same summary
    without changing the model (``str(plan)`` is a table), and the summary
    is logged at INFO level on the ``mlx_lattice.quantize`` logger.
    """
    plan = quantization_plan(model, bits, group_size)
    if not plan.quantized:
        if not plan.layers and plan.already_quantized:
            raise ValueError(f"quantize: every convolution and Linear of {type(model).__name__} is already quantized")
        if not plan.layers:
            raise ValueError(f"quantize: {type(model).__name__} has no mlx_lattice.nn convolution or Linear layer")
        raise ValueError(
            f"quantize would quantize no layer of {type(model).__name__}:\n{plan}\n"
            f"(group_size=None picks 64 or 32 per layer; MLX's affine scheme needs C_in to be a multiple of 32)"
        )
    if any(d.path == "" for d in plan.layers):
        raise TypeError(
            f"quantize changes a model's layers in place; {type(model).__name__} is itself a layer: "
            f"use nn.from_module(layer, bits, group_size), which returns its quantized form"
        )
    modules = dict(model.named_modules())
    swapped = [(d.path, from_module(modules[d.path], bits, d.group_size)) for d in plan.quantized]
    model.update_modules(tree_unflatten(swapped))
    _LOG.info("%s", plan)
    if plan.skipped:
        lines = "\n".join(f"  {d.path or '<model>'} ({d.kind}, C_in={d.c_in}): {d.reason}" for d in plan.skipped)
        warnings.warn(
            f"quantize left {len(plan.skipped)} of {len(plan.layers)} convolution/Linear layers float "
            f"(nn.quantization_plan(model) lists every layer):\n{lines}",
            QuantizationWarning,
            stacklevel=2,
        )
    return model
