"""SparseTensor: row-aligned integer coordinates and features."""

from __future__ import annotations

import numpy as np
import mlx.core as mx

from ._args import as_coords, as_feats, triple
from .manager import CoordinateManager, CoordinateSet


class SparseTensor:
    """Active voxels of a batch of 3D grids.

    coords: (N, 4) int32 rows ``(batch, x, y, z)`` in the tensor's own grid
        units (a stride-2 tensor's neighbours differ by 1). Rows must be
        unique; merge duplicates with :func:`mlx_lattice.sparse_quantize`.
        Range: batch in [0, 4096), x/y/z in [-65536, 65535].
    feats: (N, C) float32, float16 or bfloat16.
    stride: tensor stride relative to the finest grid (bookkeeping for
        conversion to world units), an int or 3-tuple.
    batch_counts: optional rows per batch item; checked against coords.
    manager: the CoordinateManager shared by a network; a new one if None.
    """

    __slots__ = ("_set", "feats", "manager")

    def __init__(self, coords, feats, stride=1, batch_counts=None, manager=None):
        if manager is None:
            manager = CoordinateManager()
        elif not isinstance(manager, CoordinateManager):
            raise TypeError(f"manager must be a CoordinateManager, got {type(manager).__name__}")
        coords = as_coords(coords)
        feats = as_feats(feats, coords.shape[0])
        stride = triple(stride, "stride", minimum=1)
        cset = manager.register(coords, stride)
        if cset.stride != stride:
            raise ValueError(
                f"stride {stride} disagrees with the stride {cset.stride} these coords were registered with"
            )
        if batch_counts is not None:
            given = np.asarray(batch_counts).astype(np.int64).ravel()
            actual = cset.batch_counts()
            n = max(len(given), len(actual))
            if not np.array_equal(np.pad(given, (0, n - len(given))), np.pad(actual, (0, n - len(actual)))):
                raise ValueError(
                    f"batch_counts {given.tolist()} do not match the batch column of coords {actual.tolist()}"
                )
        self._set = cset
        self.feats = feats
        self.manager = manager

    @classmethod
    def _from_set(cls, cset: CoordinateSet, feats: mx.array, manager: CoordinateManager):
        t = object.__new__(cls)
        t._set = cset
        t.feats = feats
        t.manager = manager
        return t

    @property
    def coords(self) -> mx.array:
        return self._set.coords

    @property
    def stride(self) -> tuple[int, int, int]:
        return self._set.stride

    @property
    def coordinate_set(self) -> CoordinateSet:
        return self._set

    @property
    def batch_counts(self) -> np.ndarray:
        return self._set.batch_counts()

    @property
    def num_batches(self) -> int:
        return len(self.batch_counts)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.feats.shape)

    @property
    def dtype(self):
        return self.feats.dtype

    def __len__(self) -> int:
        return self._set.size

    def replace(self, feats) -> "SparseTensor":
        """Same coordinates, new (N, C') features."""
        feats = as_feats(feats, len(self))
        return SparseTensor._from_set(self._set, feats, self.manager)

    def astype(self, dtype) -> "SparseTensor":
        return self.replace(self.feats.astype(dtype))

    def __repr__(self) -> str:
        return (
            f"SparseTensor(n={len(self)}, channels={self.feats.shape[1]}, "
            f"dtype={self.feats.dtype}, stride={self.stride}, batches={self.num_batches})"
        )
