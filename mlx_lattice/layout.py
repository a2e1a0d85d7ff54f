"""Weight layouts: the parameter ``(C_out, Kx, Ky, Kz, C_in)`` (or a linear
layer's ``(C_out, C_in)``) and the kernel-major ``(K, C_in, C_out)`` the
products multiply by.

A product takes either: kernel-major (any 3D weight), or the parameter
itself (``is_parameter``: any other rank, ``K = Kx * Ky * Kz``), which the
CPU routes read in place and whose layout they write weight gradients in,
so that no transpose or copy of a weight enters a training step's graph.
"""

from __future__ import annotations

import math

import mlx.core as mx


def mapped_weight(weight: mx.array) -> mx.array:
    """(C_out, Kx, Ky, Kz, C_in) (or (C_out, C_in)) -> kernel-major
    (K, C_in, C_out): a transposed view."""
    k, a, b = kernel_dims(weight)
    return weight.reshape(b, k, a).transpose(1, 2, 0)


def _shape(w) -> tuple:
    return tuple(getattr(w, "shape", w))


def is_parameter(w) -> bool:
    """Whether a weight (or its shape) is in the parameter's layout
    ``(B, k1, ..., A)`` rather than kernel-major ``(K, A, B)``."""
    return len(_shape(w)) != 3


def kernel_dims(w) -> tuple[int, int, int]:
    """(K, A, B) of a weight (or its shape) in either layout (A: the input
    channels of a group)."""
    s = _shape(w)
    if len(s) == 3:
        return s
    return math.prod(s[1:-1]), s[-1], s[0]


def kernel_major(w: mx.array) -> mx.array:
    """The weight kernel-major (K, A, B): itself, or the parameter's
    transposed view."""
    return mapped_weight(w) if is_parameter(w) else w


def like(w_kernel_major: mx.array, target) -> mx.array:
    """A kernel-major (K, A, B) array in the layout of ``target`` (a weight
    or its shape): itself, or rearranged into the parameter's shape."""
    if not is_parameter(target):
        return w_kernel_major
    return w_kernel_major.transpose(2, 0, 1).reshape(_shape(target))
