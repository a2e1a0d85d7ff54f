"""Weight layouts: the dense 5D parameter ``(C_out, Kx, Ky, Kz, C_in)`` as
the kernel-major ``(K, C_in, C_out)`` the products read."""

from __future__ import annotations

import mlx.core as mx


def mapped_weight(weight: mx.array) -> mx.array:
    """(C_out, Kx, Ky, Kz, C_in) -> kernel-major (K, C_in, C_out)."""
    c_out, kx, ky, kz, c_in = weight.shape
    return weight.reshape(c_out, kx * ky * kz, c_in).transpose(1, 2, 0)
