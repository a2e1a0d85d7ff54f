"""QuantizedWeight: int4/int8 affine-quantized convolution weights.

The packing is MLX's (``mx.quantize`` along C_in, the last axis of the 5D
weight): uint32 words holding ``32 / bits`` codes each, lowest bits first,
and one ``scale`` and ``bias`` per group of ``group_size`` input channels, so
that ``w = scale * q + bias``. Quantized convolution is for inference:
gradients reach the features but not the packed weights.
"""

from __future__ import annotations

import mlx.core as mx

from ._args import FLOAT_DTYPES, dtype_name

BITS = (4, 8)
# The group sizes MLX's affine kernels (mx.quantize, mx.dequantize,
# mx.quantized_matmul) take; 16 and smaller are refused there.
GROUP_SIZES = (32, 64, 128)
# What ``group_size=None`` picks, in order: MLX's own default where it
# divides C_in, else 32, which every multiple of 32 channels (32, 96, 160...)
# takes, and which the Metal sorted routes read at 32 and 64 channels.
DEFAULT_GROUP_SIZES = (64, 32)


def default_group_size(c_in: int):
    """The group size ``group_size=None`` picks for ``c_in`` input channels:
    64 where it divides them, else 32; None where neither does (fewer than 32
    channels, or a count such as 16, 48 or 80 that MLX's affine scheme cannot
    group)."""
    for g in DEFAULT_GROUP_SIZES:
        if c_in % g == 0:
            return g
    return None


def unquantizable_reason(c_in: int, group_size=None):
    """Why a weight of ``c_in`` input channels cannot be quantized with
    ``group_size`` (None: the default choice), or None when it can."""
    if group_size is None:
        if default_group_size(c_in) is not None:
            return None
        return (
            f"C_in = {c_in} is not a multiple of 32 (MLX's affine quantization groups 32, 64 or 128 "
            f"input channels)"
        )
    if c_in % group_size:
        return f"group_size {group_size} does not divide C_in = {c_in}"
    return None


class QuantizedWeight:
    """A 5D convolution weight ``(C_out, Kx, Ky, Kz, C_in)`` in packed form.

    codes: uint32 ``(C_out, Kx, Ky, Kz, C_in * bits / 32)``.
    scales, biases: float ``(C_out, Kx, Ky, Kz, C_in / group_size)``.
    """

    def __init__(self, codes, scales, biases, *, bits: int, group_size: int):
        if bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
        if group_size not in GROUP_SIZES:
            raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size!r}")
        for name, a in (("codes", codes), ("scales", scales), ("biases", biases)):
            if not isinstance(a, mx.array):
                raise TypeError(f"{name} must be an mx.array, got {type(a).__name__}")
            if a.ndim != 5:
                raise ValueError(f"{name} must be 5D (C_out, Kx, Ky, Kz, ...), got shape {tuple(a.shape)}")
        if codes.dtype != mx.uint32:
            raise TypeError(f"codes must be uint32, got {dtype_name(codes.dtype)}")
        if scales.dtype not in FLOAT_DTYPES or biases.dtype != scales.dtype:
            raise TypeError("scales and biases must share a float dtype (float32, float16 or bfloat16)")
        c_in = codes.shape[4] * 32 // bits
        if tuple(scales.shape) != tuple(codes.shape[:4]) + (c_in // group_size,) or scales.shape != biases.shape:
            raise ValueError(
                f"scales and biases must have shape {tuple(codes.shape[:4]) + (c_in // group_size,)} "
                f"for {bits}-bit codes of {c_in} input channels in groups of {group_size}"
            )
        self.codes, self.scales, self.biases = codes, scales, biases
        self.bits, self.group_size = bits, group_size

    @classmethod
    def from_float(cls, weight: mx.array, bits: int = 4, group_size: int | None = None) -> "QuantizedWeight":
        """Quantize a float 5D weight along C_in (``mx.quantize`` packing).
        ``group_size=None`` takes 64 where it divides C_in, else 32
        (:func:`default_group_size`)."""
        if not isinstance(weight, mx.array) or weight.ndim != 5:
            raise ValueError("weight must be a 5D mx.array (C_out, Kx, Ky, Kz, C_in)")
        if weight.dtype not in FLOAT_DTYPES:
            raise TypeError(f"weight must be float32, float16 or bfloat16, got {dtype_name(weight.dtype)}")
        if bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
        if group_size is not None and group_size not in GROUP_SIZES:
            raise ValueError(f"group_size must be one of {GROUP_SIZES} or None, got {group_size!r}")
        c_in = weight.shape[4]
        reason = unquantizable_reason(c_in, group_size)
        if reason is not None:
            hint = ("pad C_in to a multiple of 32 or keep this weight float" if group_size is None
                    else "choose a group size that divides the input channels (or group_size=None), or pad C_in")
            raise ValueError(f"{reason}; {hint}")
        group_size = group_size or default_group_size(c_in)
        codes, scales, biases = mx.quantize(weight, group_size=group_size, bits=bits)
        return cls(codes, scales, biases, bits=bits, group_size=group_size)

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """The logical 5D shape (C_out, Kx, Ky, Kz, C_in)."""
        return tuple(self.codes.shape[:4]) + (self.codes.shape[4] * 32 // self.bits,)

    @property
    def dtype(self):
        """The float dtype the weight dequantizes to."""
        return self.scales.dtype

    @property
    def ndim(self) -> int:
        return 5

    def dequantize(self) -> mx.array:
        """The float 5D weight the codes represent."""
        return mx.dequantize(self.codes, self.scales, self.biases, group_size=self.group_size, bits=self.bits)

    def kernel_major(self):
        """(codes, scales, biases) reshaped to (C_out, K, .) for the kernels."""
        c_out, kx, ky, kz = self.codes.shape[:4]
        k = kx * ky * kz
        return (
            self.codes.reshape(c_out, k, -1),
            self.scales.reshape(c_out, k, -1),
            self.biases.reshape(c_out, k, -1),
        )

    def __repr__(self) -> str:
        return f"QuantizedWeight(shape={self.shape}, bits={self.bits}, group_size={self.group_size}, dtype={dtype_name(self.dtype)})"
