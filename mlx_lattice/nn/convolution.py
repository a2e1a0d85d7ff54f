"""Convolution and linear layers on sparse tensors (parameters as in mlx.nn)."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as mnn

from .. import ops
from .._args import dtype_name, triple
from ..tensor import SparseTensor


def _check_input(layer, x, sparse_only=True):
    """TypeError naming the layer when ``x`` is not a SparseTensor (where
    the layer needs one) or its features' dtype is not the layer's."""
    if not isinstance(x, SparseTensor):
        if sparse_only:
            raise TypeError(
                f"{type(layer).__name__}({layer._extra_repr()}) takes a SparseTensor, got "
                f"{type(x).__name__}; build one with mlx_lattice.SparseTensor(coords, feats)"
            )
        return
    for name in ("weight", "bias"):
        p = layer.get(name)
        if p is not None and p.dtype != x.dtype:
            raise TypeError(
                f"{type(layer).__name__}({layer._extra_repr()}): {name} dtype {dtype_name(p.dtype)} does not "
                f"match the input features' dtype {dtype_name(x.dtype)}; cast the input (x.astype(...)) "
                "or the model (model.set_dtype(...))"
            )


class _ConvBase(mnn.Module):
    """Weight ``(C_out, Kx, Ky, Kz, C_in // groups)`` and optional bias
    ``(C_out,)``, initialised like ``mlx.nn.Conv3d``: uniform in
    ``+-sqrt(1 / (C_in // groups * K))``, bias zeros. ``groups`` splits the
    channels into groups convolved separately (``groups == C_in``:
    depthwise)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation, bias, groups=1):
        super().__init__()
        if in_channels < 1 or out_channels < 1:
            raise ValueError(f"channel counts must be positive, got {in_channels} -> {out_channels}")
        ops._check_groups(type(self).__name__, groups, in_channels, out_channels)
        ks = triple(kernel_size, "kernel_size", minimum=1)
        c_in = in_channels // groups
        scale = math.sqrt(1.0 / (c_in * ks[0] * ks[1] * ks[2]))
        self.weight = mx.random.uniform(low=-scale, high=scale, shape=(out_channels, *ks, c_in))
        self.groups = groups
        if bias:
            self.bias = mx.zeros((out_channels,))
        self.kernel_size = ks
        self.stride = triple(stride, "stride", minimum=1)
        self.padding = triple(padding, "padding", minimum=0)
        self.dilation = triple(dilation, "dilation", minimum=1)

    def _bias(self):
        return self.get("bias")

    def _extra_repr(self):
        return (
            f"{self.weight.shape[-1] * self.groups}, {self.weight.shape[0]}, "
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}, groups={self.groups}, bias={'bias' in self}"
        )


class Conv3d(_ConvBase):
    """Sparse convolution (:func:`mlx_lattice.ops.conv3d`).

    Output support: every voxel whose receptive field holds an active input,
    or ``coordinates`` (a SparseTensor or (M, 4) coords) when given to the
    call. For a stride-1 layer that keeps the input voxels use
    :class:`SubmConv3d`.
    """

    def __init__(
        self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, bias=True,
        groups=1,
    ):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, bias, groups)

    def __call__(self, x: SparseTensor, coordinates=None) -> SparseTensor:
        _check_input(self, x)
        return ops.conv3d(
            x, self.weight, self._bias(), stride=self.stride, padding=self.padding,
            dilation=self.dilation, coordinates=coordinates, groups=self.groups,
        )


class SubmConv3d(_ConvBase):
    """Submanifold convolution (:func:`mlx_lattice.ops.subm_conv3d`): output
    rows are the input rows; the kernel is centred."""

    def __init__(self, in_channels, out_channels, kernel_size=3, dilation=1, bias=True, groups=1):
        super().__init__(in_channels, out_channels, kernel_size, 1, 0, dilation, bias, groups)

    def __call__(self, x: SparseTensor) -> SparseTensor:
        _check_input(self, x)
        return ops.subm_conv3d(
            x, self.weight, self._bias(), dilation=self.dilation, groups=self.groups
        )

    def _extra_repr(self):
        return (
            f"{self.weight.shape[-1] * self.groups}, {self.weight.shape[0]}, "
            f"kernel_size={self.kernel_size}, dilation={self.dilation}, groups={self.groups}, "
            f"bias={'bias' in self}"
        )


class ConvTranspose3d(_ConvBase):
    """Transposed sparse convolution (:func:`mlx_lattice.ops.conv_transpose3d`).

    Lands on ``coordinates`` when given, else on the finer voxels a
    :class:`Conv3d` with this stride came from (U-Net decoders), else on
    ``stride * p``. Initialised like ``mlx.nn.ConvTranspose3d``.
    """

    def __init__(
        self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, bias=True,
        groups=1,
    ):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, bias, groups)

    def __call__(self, x: SparseTensor, coordinates=None) -> SparseTensor:
        _check_input(self, x)
        return ops.conv_transpose3d(
            x, self.weight, self._bias(), stride=self.stride, padding=self.padding,
            dilation=self.dilation, coordinates=coordinates, groups=self.groups,
        )


class GenerativeConvTranspose3d(_ConvBase):
    """Transposed convolution onto every reachable voxel
    (:func:`mlx_lattice.ops.generative_conv_transpose3d`): the support grows."""

    def __init__(
        self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, bias=True,
        groups=1,
    ):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, bias, groups)

    def __call__(self, x: SparseTensor) -> SparseTensor:
        _check_input(self, x)
        return ops.generative_conv_transpose3d(
            x, self.weight, self._bias(), stride=self.stride, padding=self.padding,
            dilation=self.dilation, groups=self.groups,
        )


class Linear(mnn.Module):
    """``y = x W^T + b`` on each voxel's features; weight ``(C_out, C_in)``.

    Initialised like ``mlx.nn.Linear`` (weight and bias uniform in
    ``+-sqrt(1 / C_in)``). On a SparseTensor it runs as a 1x1x1 convolution
    (the project's pointwise kernel; rows and coordinate set are kept). A
    plain ``(..., C_in)`` array, e.g. the ``(B, C)`` output of global pooling,
    gets the ordinary affine map.
    """

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True):
        super().__init__()
        scale = math.sqrt(1.0 / in_channels)
        self.weight = mx.random.uniform(low=-scale, high=scale, shape=(out_channels, in_channels))
        if bias:
            self.bias = mx.random.uniform(low=-scale, high=scale, shape=(out_channels,))

    def _extra_repr(self):
        return f"input_dims={self.weight.shape[1]}, output_dims={self.weight.shape[0]}, bias={'bias' in self}"

    def __call__(self, x):
        _check_input(self, x, sparse_only=False)
        if isinstance(x, SparseTensor):
            return ops.linear(x, self.weight, self.get("bias"))
        if "bias" in self:
            return mx.addmm(self.bias, x, self.weight.T)
        return x @ self.weight.T
