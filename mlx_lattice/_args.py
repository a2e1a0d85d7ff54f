"""Argument normalisation and validation shared by the public API."""

from __future__ import annotations

import numpy as np
import mlx.core as mx

FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)
INT_DTYPES = (mx.int8, mx.int16, mx.int32, mx.int64, mx.uint8, mx.uint16, mx.uint32, mx.uint64)


def triple(value, name: str, *, minimum: int) -> tuple[int, int, int]:
    """An int or 3-sequence of ints, each >= minimum, as a 3-tuple."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int or a 3-tuple of ints, got {value!r}")
    if isinstance(value, (int, np.integer)):
        vals = (int(value),) * 3
    else:
        try:
            vals = tuple(value)
        except TypeError:
            raise TypeError(f"{name} must be an int or a 3-tuple of ints, got {value!r}") from None
        if len(vals) != 3 or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in vals
        ):
            raise TypeError(f"{name} must be an int or a 3-tuple of ints, got {value!r}")
        vals = tuple(int(v) for v in vals)
    if any(v < minimum for v in vals):
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{name} must be {what}, got {vals}")
    return vals


def dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("mlx.core.", "")
    return name


# Asked for every convolution product: str() of an MLX dtype is slow.
_DTYPE_NAMES: dict = {}


def as_coords(coords, name: str = "coords") -> mx.array:
    """(N, 4) integer coordinates as a contiguous int32 mx.array."""
    if isinstance(coords, mx.array):
        if coords.dtype not in INT_DTYPES:
            raise TypeError(f"{name} must have an integer dtype, got {dtype_name(coords.dtype)}")
        shape = tuple(coords.shape)
        if len(shape) != 2 or shape[1] != 4:
            raise ValueError(f"{name} must have shape (N, 4) with rows (batch, x, y, z), got {shape}")
        if coords.dtype == mx.int32:
            # Returned as is: the manager keys coordinate sets by array identity.
            return coords
        arr = np.array(coords)
    else:
        arr = np.asarray(coords)
        if arr.size == 0 and arr.ndim <= 1:
            arr = arr.reshape(0, 4).astype(np.int32)
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"{name} must have an integer dtype, got {arr.dtype}")
        if arr.ndim != 2 or arr.shape[1] != 4:
            raise ValueError(f"{name} must have shape (N, 4) with rows (batch, x, y, z), got {arr.shape}")
    if arr.size and (arr.min() < np.iinfo(np.int32).min or arr.max() > np.iinfo(np.int32).max):
        raise ValueError(f"{name} values do not fit in int32")
    return mx.array(np.ascontiguousarray(arr, dtype=np.int32))


def row_contiguous(coords: mx.array) -> mx.array:
    """Coordinates from :func:`as_coords` laid out as the coordinate hash
    table reads them (row-contiguous). as_coords keeps an int32 mx.array as
    is, transposed or sliced too (coordinate sets are keyed by identity)."""
    return mx.contiguous(coords)


def as_table_coords(coords, name: str = "coords") -> mx.array:
    """:func:`as_coords`, row-contiguous: coordinates read by the hash table
    without being registered (set operations' arguments and queries)."""
    return row_contiguous(as_coords(coords, name))


def as_feats(feats, n_rows: int) -> mx.array:
    if not isinstance(feats, mx.array):
        arr = np.asarray(feats)
        if not np.issubdtype(arr.dtype, np.floating):
            raise TypeError(f"feats must be a floating array, got {arr.dtype}")
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        feats = mx.array(arr)
    if feats.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"feats must be float32, float16 or bfloat16, got {dtype_name(feats.dtype)}"
        )
    if feats.ndim != 2:
        raise ValueError(f"feats must have shape (N, C), got {tuple(feats.shape)}")
    if feats.shape[0] != n_rows:
        raise ValueError(
            f"feats has {feats.shape[0]} rows but coords has {n_rows}; they must be row-aligned"
        )
    return feats
