"""SparseTensor: row-aligned integer coordinates and features."""

from __future__ import annotations

import numpy as np
import mlx.core as mx

from ._args import FLOAT_DTYPES, INT_DTYPES, as_coords, as_feats, triple
from .manager import CoordinateManager, CoordinateSet, owner_of

# Attribute names of other sparse libraries' tensors (spconv's
# SparseConvTensor, TorchSparse's and MinkowskiEngine's SparseTensor), and of
# mx.array, with what to use here instead.
_LIBRARY_NAMES = {
    "features": "`.feats` (the (N, C) features)",
    "F": "`.feats` (the (N, C) features)",
    "indices": "`.coords` ((N, 4) int32 rows (batch, x, y, z); spconv models fed (batch, z, y, x) "
               "convert with mlx_lattice.convert.source_coordinates(idx, axes='zyx'))",
    "C": "`.coords` ((N, 4) int32 rows (batch, x, y, z) in the tensor's own grid units; "
         "`.finest_coords()` gives MinkowskiEngine's finest-grid units)",
    "coordinates": "`.coords` ((N, 4) int32 rows (batch, x, y, z) in the tensor's own grid units; "
                   "`.finest_coords()` gives MinkowskiEngine's finest-grid units)",
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

    A new tensor never changes what an existing one sees: given another
    tensor's coordinates with a ``batch_counts`` that sets another batch
    size, it gets a coordinate set of its own on the same manager (same rows;
    a transposed convolution from it lands where one from ``t`` would; its
    relations are built anew). A set's coordinates, stride and batch counts
    are read-only; do not assign into ``t.coords`` (the array is shared by
    every tensor on the set and hashed once): build a new tensor instead.
    """

    __slots__ = ("_set", "feats", "_manager")

    def __init__(self, coords, feats, stride=None, batch_counts=None, manager=None):
        if manager is not None and not isinstance(manager, CoordinateManager):
            raise TypeError(f"manager must be a CoordinateManager, got {type(manager).__name__}")
        if manager is None and isinstance(coords, mx.array):
            owner = owner_of(coords)
            if owner is not None:
                manager = owner[0]
        if manager is None:
            manager = CoordinateManager()
        try:
            coords = as_coords(coords)
        except TypeError:
            _check_order(coords, feats)
            raise
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
            actual = cset.column_counts()
            n = max(len(given), len(actual))
            if not np.array_equal(np.pad(given, (0, n - len(given))), np.pad(actual, (0, n - len(actual)))):
                raise ValueError(
                    f"batch_counts {given.tolist()} do not match the batch column of coords {actual.tolist()}"
                )
            if known is None:
                cset._declare_batches(n)  # a set made by this call: no other tensor sees it
            else:
                # Another tensor's set: its batch size is what that tensor
                # sees, so another batch size takes a set of its own.
                cset = manager.with_batches(cset, n)
        self._set = cset
        self.feats = feats
        self._manager = manager

    @classmethod
    def _from_set(cls, cset: CoordinateSet, feats: mx.array, manager: CoordinateManager):
        t = object.__new__(cls)
        t._set = cset
        t.feats = feats
        t._manager = manager
        return t

    @property
    def manager(self) -> CoordinateManager:
        """The CoordinateManager holding this tensor's coordinate set and
        relations (read-only: the set belongs to it)."""
        return self._manager

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

    def finest_coords(self) -> mx.array:
        """``(N, 4)`` int32 rows ``(batch, sx*x, sy*y, sz*z)``: the
        coordinates in finest-grid units (``s = self.stride``), the units
        MinkowskiEngine gives a strided tensor's coordinates. ``self.coords``
        are in this tensor's own grid units (neighbours differ by 1)."""
        return _to_int32(_coords64(self.coords) * np.array([1, *self.stride], np.int64), "finest_coords")

    def grid_coords(self, coords) -> mx.array:
        """Finest-grid coordinates (MinkowskiEngine's units) to this
        tensor's grid units: ``(b, x // sx, y // sy, z // sz)``, the voxel of
        this tensor's grid that contains each finest voxel (exact for a
        multiple of the stride, as MinkowskiEngine's coordinates of a strided
        tensor are). The result can be looked up in this tensor
        (:func:`mlx_lattice.lookup`). ``coords``: ``(M, 4)`` integers, any
        layout the constructor takes."""
        c = _coords64(as_coords(coords, "coords"))
        return _to_int32(np.floor_divide(c, np.array([1, *self.stride], np.int64)), "grid_coords")

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


def _kind(a):
    """('float' | 'int' | None, shape) of an array-like, without copying an mx.array."""
    if isinstance(a, mx.array):
        dt = a.dtype
        kind = "float" if dt in FLOAT_DTYPES or dt == mx.float64 else "int" if dt in INT_DTYPES else None
        return kind, tuple(a.shape)
    try:
        arr = np.asarray(a)
    except Exception:  # noqa: BLE001  (not array-like: no hint to give)
        return None, ()
    if np.issubdtype(arr.dtype, np.floating):
        return "float", arr.shape
    return ("int" if np.issubdtype(arr.dtype, np.integer) else None), arr.shape


def _check_order(coords, feats) -> None:
    """Raise a TypeError that says so when ``(coords, feats)`` look like
    ``(feats, coords)`` (TorchSparse's argument order): floats first, an
    integer ``(N, 4)`` array second."""
    c_kind, c_shape = _kind(coords)
    f_kind, f_shape = _kind(feats)
    if c_kind == "float" and f_kind == "int" and len(f_shape) == 2 and f_shape[1] == 4:
        raise TypeError(
            f"coords must have an integer dtype, but the first argument holds floats {c_shape} and the "
            f"second integers {f_shape}: the arguments look swapped. mlx_lattice takes coordinates first, "
            "SparseTensor(coords, feats), with coords (N, 4) integer rows (batch, x, y, z) and feats "
            "(N, C) floats (TorchSparse's SparseTensor(feats, coords) has them the other way round)"
        )


def _coords64(coords: mx.array) -> np.ndarray:
    return np.array(coords).astype(np.int64).reshape(-1, 4)


def _to_int32(c: np.ndarray, op: str) -> mx.array:
    lim = np.iinfo(np.int32)
    if c.size and (c.min() < lim.min or c.max() > lim.max):
        raise ValueError(f"{op}: coordinates do not fit in int32")
    return mx.array(np.ascontiguousarray(c, dtype=np.int32))


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
