"""Relation: the edges of one sparse convolution as CSR arrays."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import mlx.core as mx

from . import _ext
from .backends.base import Views

MAP_KINDS = ("forward", "target", "submanifold", "transposed", "generative")


@dataclass(frozen=True)
class KernelGeometry:
    kernel_size: tuple[int, int, int]
    stride: tuple[int, int, int] = (1, 1, 1)
    padding: tuple[int, int, int] = (0, 0, 0)
    dilation: tuple[int, int, int] = (1, 1, 1)

    @property
    def volume(self) -> int:
        k = self.kernel_size
        return k[0] * k[1] * k[2]

    def args(self):
        return self.kernel_size, self.stride, self.padding, self.dilation


@dataclass(frozen=True)
class InputMajorView:
    """Edges sorted by (input row, kernel offset); perm maps view -> edge."""

    offsets: mx.array
    perm: mx.array
    out_idx: mx.array
    k_idx: mx.array


@dataclass(frozen=True)
class KernelMajorView:
    """Edges sorted by (kernel offset, output row); perm maps view -> edge."""

    offsets: mx.array
    perm: mx.array
    in_idx: mx.array
    out_idx: mx.array


@dataclass(frozen=True)
class SortedPlan:
    """Output rows ordered by neighbour bitmask, for implicit-GEMM routes.

    ``reorder_rows[i]`` is the public output row at sorted position i;
    ``sorted_out_in_map`` (N_out, K) and ``sorted_kv_out_in_map`` (K, N_out)
    hold the input row per offset (-1 empty) in sorted order; ``tile_masks``
    (uint64) ORs the offset masks of each ``tile`` consecutive sorted rows.
    """

    reorder_rows: mx.array
    sorted_out_in_map: mx.array
    sorted_kv_out_in_map: mx.array
    tile_masks: mx.array
    tile: int


class Relation:
    """Edges (out, in, k) of a convolution, sorted by (output row, offset).

    ``out_offsets`` (N_out + 1) delimits each output row's edges in
    ``in_idx``/``k_idx``. The input-major and kernel-major views, ``out_idx``
    and the sorted plan are built on first use and kept, by the backend that
    built the relation (``backend``), and read through its views object
    (mlx_lattice/backends/base.py ``Views``) the same way on every backend.
    A relation whose builder read its largest row counts (``max_neighbors``:
    output rows, ``max_in_neighbors``: input rows) in the synchronisation of
    its size carries them, so that nothing reads its arrays on the host.
    ``symmetric`` (the native relation's mark, which every builder sets):
    edge (q, p, k) exists exactly when (p, q, K - 1 - k) does (a centred odd
    kernel at stride 1 onto the same rows), so input gradients can run on
    this relation with the kernel offsets mirrored.
    """

    def __init__(self, native, geometry: KernelGeometry, backend: str = "cpu", views=None,
                 max_neighbors: int | None = None, max_in_neighbors: int | None = None):
        self._native = native
        self.geometry = geometry
        self.backend = backend
        self._stats = None
        self._views = Views(native) if views is None else views
        self._max = (max_neighbors, max_in_neighbors)
        self._swapped = None  # {(kind, geometry): Relation}, made on first use
        self._swapped_of = None  # weak reference to the relation this one swaps

    kind = property(lambda self: self._native.kind)
    n_in = property(lambda self: self._native.n_in)
    n_out = property(lambda self: self._native.n_out)
    kernel_volume = property(lambda self: self._native.kernel_volume)
    edges = property(lambda self: self._native.edges)
    symmetric = property(lambda self: self._native.symmetric)
    out_offsets = property(lambda self: self._native.out_offsets)
    in_idx = property(lambda self: self._native.in_idx)
    k_idx = property(lambda self: self._native.k_idx)
    neighbor_map = property(lambda self: self._native.neighbor_map)

    @property
    def out_idx(self) -> mx.array:
        return self._views.out_idx()

    def input_major(self) -> InputMajorView:
        return InputMajorView(*self._views.input_major())

    def kernel_major(self) -> KernelMajorView:
        return KernelMajorView(*self._views.kernel_major())

    def sorted_plan(self) -> SortedPlan:
        return SortedPlan(*self._views.sorted_plan(), tile=_ext.Relation.plan_tile)

    def stats(self) -> dict:
        if self._stats is None:
            n_out = self.n_out
            known = self._max[0]
            self._stats = {
                "kind": self.kind,
                "edges": self.edges,
                "n_in": self.n_in,
                "n_out": n_out,
                "k": self.kernel_volume,
                "mean_neighbors": self.edges / n_out if n_out else 0.0,
                "max_neighbors": known if known is not None else self._native.max_neighbors,
            }
        return dict(self._stats)

    def swapped(self, kind: str, geometry: KernelGeometry) -> "Relation":
        """The relation with input and output roles exchanged, labelled
        ``kind``: made once per label and kept by this relation; swapped
        back, this relation itself while it lives. The link back is weak, so
        that the pair is freed with its last user, without waiting for the
        garbage collector (a sample's maps hold GPU memory)."""
        back = self._swapped_of() if self._swapped_of is not None else None
        if back is not None and back.kind == kind and back.geometry == geometry:
            return back
        key = (kind, geometry)
        if self._swapped is None:
            self._swapped = {}
        rel = self._swapped.get(key)
        if rel is None:
            native, views = self._views.swapped(kind, geometry)
            rel = Relation(native, geometry, self.backend, views,
                           max_neighbors=self._max[1], max_in_neighbors=self._max[0])
            rel._swapped_of = weakref.ref(self)
            self._swapped[key] = rel
        return rel

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"Relation(kind={s['kind']!r}, n_in={s['n_in']}, n_out={s['n_out']}, "
            f"k={s['k']}, edges={s['edges']}, mean_neighbors={s['mean_neighbors']:.2f})"
        )
