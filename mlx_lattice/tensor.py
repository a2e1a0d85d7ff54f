"""SparseTensor: row-aligned integer coordinates and features."""

from __future__ import annotations

import numpy as np
import mlx.core as mx

from ._args import as_coords, as_feats, triple
from .manager import CoordinateManager, CoordinateSet, owner_of

# Attribute names of other sparse libraries' tensors (spconv's
# SparseConvTensor, TorchSparse's and MinkowskiEngine's SparseTensor), and of
# mx.array, with what to use here instead.
_LIBRARY_NAMES = {
    "features": "`.feats` (the (N, C) features)",
    "F": "`.feats` (the (N, C) features)",
    "indices": "`.coords` ((N, 4) int32 rows (batch, x, y, z); spconv models fed (batch, z, y, x) "
               "convert with mlx_lattice.convert.source_coordinates(idx, axes='zyx'))",
    "C": "`.coords` ((N, 4) int32 rows (batch, x, y, z))",
    "coordinates": "`.coords` ((N, 4) int32 rows (batch, x, y, z))",
    "replace_feature": "`.replace(feats)` (same coordinates and coordinate manager, new features)",
    "dense": "`mlx_lattice.to_dense(t)` (a (B, X, Y, Z, C) array, channels last)",
    "spatial_shape": "nothing: coordinates are unbounded here; `mlx_lattice.to_dense(t, shape)` takes a grid "
                     "shape, and `mlx_lattice.crop` cuts a box",
    "batch_size": "`.num_batches` (pass `batch_counts=` when building the tensor to keep empty trailing items)",
    "s": "`.stride` (a 3-tuple)",
    "tensor_stride": "`.stride` (a 3-tuple)",
    "indice_dict": "`.manager` (the CoordinateManager caching coordinate sets and relations)",
    "cmaps": "`.manager` (the CoordinateManager caching coordinate sets and relations)",
    "kmaps": "`.manager` (the CoordinateManager caching coordinate sets and relations)",
    "coordinate_manager": "`.manager` (the CoordinateManager caching coordinate sets and relations)",
    "coordinate_map_key": "`.coordinate_set` (tensors on the same set share rows and relations)",
    "decomposed_features": "`t.feats[mx.array(np.flatnonzero(np.array(t.coords[:, 0]) == b))]` per batch item b, "
                           "or `t.batch_counts` to split t.feats",
}
_ARRAY_NAMES = (
    "ndim", "size", "T", "reshape", "transpose", "flatten", "squeeze", "sum", "mean", "max", "min",
    "item", "tolist", "at", "nbytes", "itemsize", "square", "sqrt", "exp", "log", "abs",
)
_ARRAY_HINT = (
    "a SparseTensor is not an mx.array, so mlx.nn layers and mx ops do not take it: use the layer of "
    "the same name in mlx_lattice.nn (ReLU, Linear, BatchNorm, LayerNorm, Dropout, ...; "
    "nn.FeatureMap(layer) wraps any other), or map the features with `t.replace(fn(t.feats))`"
)


class SparseTensor:
    """Active voxels of a batch of 3D grids.

    coords: (N, 4) int32 rows ``(batch, x, y, z)`` in the tensor's own grid
        units (a stride-2 tensor's neighbours differ by 1). Rows must be
        unique; merge duplicates with :func:`mlx_lattice.sparse_quantize`.
        Range: batch in [0, 4096), x/y/z in [-65536, 65535].
    feats: (N, C) float32, float16 or bfloat16.
    stride: tensor stride relative to the finest grid (bookkeeping for
        conversion to world units), an int or 3-tuple. By default the stride
        the coordinates were registered with (when they are another tensor's
        ``.coords``), else 1.
    batch_counts: optional rows per batch item, checked against coords. It
        also sets the batch size: ``batch_counts=[2, 0]`` makes a tensor of two
        batch items whose last one is empty (``num_batches == 2``; global
        pooling gives it a row), which the batch column alone cannot say.
        Tensors computed from this one keep that batch size.
    manager: the CoordinateManager shared by a network. By default: when
        ``coords`` is the very ``mx.array`` of a live tensor's coordinates
        (``SparseTensor(t.coords, f)``), that tensor's manager and coordinate
        set (so the new tensor shares its rows, relations and the encoder
        voxels a later ``conv_transpose3d`` lands on, exactly as
        ``t.replace(f)``); else a new manager.
    """

    __slots__ = ("_set", "feats", "manager")

    def __init__(self, coords, feats, stride=None, batch_counts=None, manager=None):
        if manager is not None and not isinstance(manager, CoordinateManager):
            raise TypeError(f"manager must be a CoordinateManager, got {type(manager).__name__}")
        if manager is None and isinstance(coords, mx.array):
            owner = owner_of(coords)
            if owner is not None:
                manager = owner[0]
        if manager is None:
            manager = CoordinateManager()
        coords = as_coords(coords)
        feats = as_feats(feats, coords.shape[0])
        known = manager.find(coords)
        if stride is None:
            stride = known.stride if known is not None else (1, 1, 1)
        stride = triple(stride, "stride", minimum=1)
        cset = manager.register(coords, stride)
        if cset.stride != stride:
            raise ValueError(
                f"stride {stride} disagrees with the stride {cset.stride} these coords were registered "
                f"with; leave stride out to take it from the coordinates, or use t.replace(feats)"
            )
        if batch_counts is not None:
            given = _as_counts(batch_counts)
            actual = cset.batch_counts()
            n = max(len(given), len(actual))
            if not np.array_equal(np.pad(given, (0, n - len(given))), np.pad(actual, (0, n - len(actual)))):
                raise ValueError(
                    f"batch_counts {given.tolist()} do not match the batch column of coords {actual.tolist()}"
                )
            cset.declare_batches(len(given))
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
        """Rows per batch item, ``(num_batches,)`` (zeros for empty items)."""
        return self._set.batch_counts()

    @property
    def num_batches(self) -> int:
        """Batch items: one past the largest batch index, or the declared
        ``batch_counts`` length when that is larger."""
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

    def __getattr__(self, name):
        # Only reached for names the class does not define.
        if name in _LIBRARY_NAMES:
            raise AttributeError(f"'SparseTensor' object has no attribute {name!r}; use {_LIBRARY_NAMES[name]}")
        if name in _ARRAY_NAMES:
            raise AttributeError(f"'SparseTensor' object has no attribute {name!r}: {_ARRAY_HINT}")
        raise AttributeError(f"'SparseTensor' object has no attribute {name!r}")

    def __repr__(self) -> str:
        return (
            f"SparseTensor(n={len(self)}, channels={self.feats.shape[1]}, "
            f"dtype={self.feats.dtype}, stride={self.stride}, batches={self.num_batches})"
        )


def _as_counts(batch_counts) -> np.ndarray:
    c = np.asarray(batch_counts)
    if c.ndim != 1 or not (np.issubdtype(c.dtype, np.integer) or c.size == 0):
        raise ValueError(f"batch_counts must be a 1-D sequence of ints (rows per batch item), got {c.tolist()!r}")
    if (c < 0).any():
        raise ValueError(f"batch_counts must be non-negative, got {c.tolist()}")
    return c.astype(np.int64)


def target_set(x: "SparseTensor", coordinates, stride) -> CoordinateSet:
    """The coordinate set an op on ``x`` writes to when the caller names its
    outputs (``coordinates=``): another tensor's set on x's manager, or an
    array hashed into x's manager at ``stride``."""
    if isinstance(coordinates, SparseTensor):
        if coordinates.manager is not x.manager:
            raise ValueError(
                "coordinates must belong to the same CoordinateManager as x; pass the target's "
                "coordinate array instead, coordinates=t.coords (hashed into x's manager), or build "
                "both tensors on one manager (t.replace(feats) or SparseTensor(t.coords, feats) "
                "keep t's manager; SparseTensor(..., manager=x.manager) joins x's)"
            )
        return coordinates.coordinate_set
    return x.manager.register(as_coords(coordinates, "coordinates"), stride)
