"""CoordinateManager: coordinate sets and the relations between them, cached.

A network built on one manager hashes each coordinate set once and builds each
relation once; every layer with the same geometry, and the backward pass,
reuse it (no user-visible keys).
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref

import numpy as np
import mlx.core as mx

from . import _ext, backends, diagnostics
from ._args import row_contiguous
from .relation import KernelGeometry, Relation


def map_backend():
    """The backend that builds maps for sets registered now (the one that
    runs calls on the default device; the CPU where that GPU is unusable)."""
    return backends.executing()[0]


def map_route() -> str:
    """The registry route that builds maps for sets registered now."""
    return map_backend().map_route


def _record_map(product: str, backend, before, **fields) -> None:
    """The map record of a build that started at sync count ``before``."""
    after = backend.syncs()
    syncs = None if before is None or after is None else after - before
    diagnostics.map_record(product, backend.map_route, syncs=syncs, **fields)


class CoordinateSet:
    """One registered coordinate set (row order is the tensor's row order)."""

    _ids = itertools.count()

    def __init__(self, coords: mx.array, stride: tuple[int, int, int], source=None, trusted=False):
        self.id = next(CoordinateSet._ids)
        # Read-only (properties below): every tensor on this set, and every
        # relation cached for it, reads these.
        self._coords = coords
        self._source = source  # the array the user registered, if copied
        self._stride = tuple(stride)
        # Hashing validates range and uniqueness up front, by the backend
        # that builds maps now (its relations are then built there too). An
        # output support (``trusted``) is valid by construction: a GPU table
        # skips reading the error flags back (a synchronisation).
        self.backend = backend = map_backend()
        before = backend.syncs()
        self.native_table = backend.table(coords, trusted=trusted)
        self._table = self.native_table if backend is backends.CPU else None
        n = coords.shape[0]
        _record_map("table", backend, before, map_kind=None, n_in=n, n_out=n, k=1, edges=0)
        self._batch_counts = None
        # Batch items declared beyond the last one holding a voxel (empty
        # trailing items): at least ``_declared_batches`` items, and at least
        # as many as the set it was derived from (a convolution's output
        # keeps its input's batch size).
        self._declared_batches = 0
        self._batch_parent = None
        self._manager = None  # weak reference to the owning manager

    @property
    def coords(self) -> mx.array:
        """``(N, 4)`` int32 rows, shared by every tensor on this set."""
        return self._coords

    @property
    def source(self):
        """The array the user registered when it was copied to be
        row-contiguous, else None."""
        return self._source

    @property
    def stride(self) -> tuple[int, int, int]:
        return self._stride

    @property
    def manager(self):
        """The CoordinateManager that registered this set (None once it is gone)."""
        return None if self._manager is None else self._manager()

    @property
    def table(self):
        """The CPU table (lookups outside map building); built on first use
        for sets hashed on the GPU."""
        if self._table is None:
            self._table = _ext.CoordTable(self.coords)
        return self._table

    @property
    def size(self) -> int:
        return self.coords.shape[0]

    @property
    def num_batches(self) -> int:
        """Batch items: one past the largest batch index, or more where a
        batch size was declared (``batch_counts=``) on this set or the set it
        was derived from."""
        return len(self.batch_counts())

    def _declare_batches(self, n: int) -> None:
        """Record that this set spans at least ``n`` batch items (the last
        ones may hold no voxel). Only for a set no tensor holds yet: the
        batch size of a set is part of what its tensors see, so a tensor
        wanting another one gets its own set
        (:meth:`CoordinateManager.with_batches`)."""
        if n > self._declared_batches:
            self._declared_batches = int(n)

    def _min_batches(self) -> int:
        n = self._declared_batches
        if self._batch_parent is not None:
            n = max(n, self._batch_parent._min_batches())
        return n

    def column_counts(self) -> np.ndarray:
        """Rows per batch index of the batch column alone, up to the largest
        index (read-only: cached and shared by the set's tensors)."""
        if self._batch_counts is None:
            b = np.array(self.coords[:, 0]) if self.size else np.zeros(0, np.int32)
            counts = np.bincount(b, minlength=int(b.max()) + 1 if b.size else 0).astype(np.int64)
            counts.setflags(write=False)
            self._batch_counts = counts
        return self._batch_counts

    def batch_counts(self) -> np.ndarray:
        """Rows per batch item, ``(num_batches,)`` int64 (zeros for empty
        items). Read-only: writing into it would change what every tensor on
        the set sees."""
        counts = self.column_counts()
        extra = self._min_batches() - len(counts)
        if extra <= 0:
            return counts
        padded = np.pad(counts, (0, extra))
        padded.setflags(write=False)
        return padded


# Every live coordinate set by the id of its coordinate arrays (the stored
# array and the one the user registered). A SparseTensor built from an array
# that is a live set's coordinates joins that set and its manager (checked
# with ``is``: an id alone may be reused once its array is gone).
_OWNERS: "weakref.WeakValueDictionary[int, CoordinateSet]" = weakref.WeakValueDictionary()
_OWNERS_LOCK = threading.Lock()


def _live_owner(arr):
    s = _OWNERS.get(id(arr))
    if s is None or not (s.coords is arr or s.source is arr) or s.manager is None:
        return None
    return s


def _record_owner(s: "CoordinateSet", manager: "CoordinateManager") -> None:
    """Record ``manager`` as the owner of ``s``'s arrays; an array a live
    set of another manager already owns (a tensor's coordinates registered
    again as another network's ``coordinates=``) keeps its first owner."""
    s._manager = weakref.ref(manager)
    with _OWNERS_LOCK:
        for arr in (s.coords, s.source):
            if arr is not None and _live_owner(arr) is None:
                _OWNERS[id(arr)] = s


def owner_of(coords):
    """``(manager, coordinate set)`` when ``coords`` is (the very array
    object of) a live coordinate set's coordinates, else None."""
    with _OWNERS_LOCK:
        s = _live_owner(coords)
    if s is None:
        return None
    manager = s.manager
    return None if manager is None else (manager, s)


class CoordinateManager:
    """Caches coordinate sets and relations keyed by their geometry."""

    def __init__(self):
        self._sets: dict[int, CoordinateSet] = {}  # id(coords array) -> set
        self._relations: dict[tuple, tuple[Relation, CoordinateSet | None]] = {}
        # (coarse set id, stride) -> (fine set, geometry of the relation)
        self._parents: dict[tuple, tuple[CoordinateSet, KernelGeometry]] = {}
        # (set id, batch size) -> the set's rows with that batch size
        self._variants: dict[tuple, CoordinateSet] = {}
        self._lock = threading.RLock()
        self.builds = 0
        self.hits = 0
        self.build_seconds = 0.0

    # ------------------------------------------------------------ sets
    def register(self, coords: mx.array, stride=(1, 1, 1)) -> CoordinateSet:
        """The set for this coordinate array, hashing it on first sight."""
        with self._lock:
            s = self._sets.get(id(coords))
            if s is not None and (s.coords is coords or s.source is coords):
                return s
            contiguous = row_contiguous(coords)
            s = CoordinateSet(contiguous, tuple(stride), source=coords)
            # Both arrays stay referenced by the set, so their ids stay unique.
            self._sets[id(coords)] = s
            self._sets[id(contiguous)] = s
            _record_owner(s, self)
            return s

    def find(self, coords) -> CoordinateSet | None:
        """The set this manager registered for this very array, or None."""
        with self._lock:
            s = self._sets.get(id(coords))
            if s is not None and (s.coords is coords or s.source is coords):
                return s
            return None

    def with_batches(self, s: CoordinateSet, n: int) -> CoordinateSet:
        """``s``'s rows as a set of exactly ``n`` batch items (``n`` at least
        one past ``s``'s largest batch index): ``s`` itself when it has that
        batch size, else a set of its own, made once per ``(s, n)``.

        The batch size belongs to the set (what is computed from a tensor
        keeps it), so a tensor declaring another batch size on ``s``'s rows
        (``SparseTensor(t.coords, f, batch_counts=...)``) cannot share ``s``
        without changing what ``s``'s tensors see. The new set has its own
        coordinate array (an alias of ``s``'s rows, so
        ``SparseTensor(v.coords, f)`` joins it) and relations, and inherits
        the finer sets recorded for ``s``, so a transposed convolution from
        it lands where one from ``s`` would."""
        least = len(s.column_counts())
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < least:
            raise ValueError(f"with_batches: n must be an int >= {least} (one past the largest batch index), got {n!r}")
        if s.num_batches == n:
            return s
        key = (s.id, int(n))
        with self._lock:
            v = self._variants.get(key)
            if v is not None:
                return v
            # A new array object on the same rows: sets are found by identity.
            alias = mx.contiguous(s.coords)
            v = CoordinateSet(alias, s.stride, trusted=True)
            v._declare_batches(n)
            self._sets[id(alias)] = v
            _record_owner(v, self)
            for (sid, step), parent in list(self._parents.items()):
                if sid == s.id:
                    self._parents[(v.id, step)] = parent
            self._variants[key] = v
            return v

    def _new_set(self, coords: mx.array, stride, trusted=False, parent=None) -> CoordinateSet:
        """A set this manager derived (an op's output); ``parent``: the set
        it came from, whose batch size it keeps."""
        s = CoordinateSet(coords, tuple(stride), trusted=trusted)
        s._batch_parent = parent
        self._sets[id(coords)] = s
        _record_owner(s, self)
        return s

    # ------------------------------------------------------------ relations
    def _cached(self, key, build):
        with self._lock:
            hit = self._relations.get(key)
            if hit is not None:
                self.hits += 1
                return hit
            t0 = time.perf_counter()
            value = build()
            self.build_seconds += time.perf_counter() - t0
            self.builds += 1
            self._relations[key] = value
            return value

    def _build(self, src: CoordinateSet, out_coords, geom: KernelGeometry, transposed, kind, out_set=None):
        backend = src.backend
        before = backend.syncs()
        out_table = out_set.native_table if out_set is not None and out_set.backend is backend else None
        native, views, max_out, max_in = backend.relation(
            src.native_table, out_coords, geom.args(), transposed, kind, out_table)
        rel = Relation(native, geom, backend.name, views, max_neighbors=max_out, max_in_neighbors=max_in)
        _record_map("relation", backend, before, map_kind=kind, n_in=rel.n_in, n_out=rel.n_out,
                    k=rel.kernel_volume, edges=rel.edges, geometry=geom.args())
        return rel

    @staticmethod
    def _support(src: CoordinateSet, geom: KernelGeometry, generative: bool):
        backend = src.backend
        before = backend.syncs()
        out = backend.support(src.native_table, geom.args(), generative)
        _record_map("support", backend, before, map_kind="generative" if generative else "forward",
                    n_in=src.size, n_out=out.shape[0], k=geom.volume, edges=0, geometry=geom.args())
        return out

    def kernel_relation(self, src: CoordinateSet, geom: KernelGeometry):
        """Strided/padded convolution; output = every reachable grid point."""
        key = ("forward", src.id, geom)

        def build():
            out = self._support(src, geom, generative=False)
            stride = tuple(a * b for a, b in zip(src.stride, geom.stride))
            out_set = self._new_set(out, stride, trusted=True, parent=src)
            self._parents.setdefault((out_set.id, geom.stride), (src, geom))
            return self._build(src, out, geom, False, "forward", out_set), out_set

        return self._cached(key, build)

    def target_kernel_relation(self, src: CoordinateSet, dst: CoordinateSet, geom: KernelGeometry):
        """Convolution read out at explicit target coordinates."""
        key = ("target", src.id, dst.id, geom)
        return self._cached(key, lambda: (self._build(src, dst.coords, geom, False, "target"), dst))[0]

    def submanifold_kernel_relation(self, src: CoordinateSet, geom: KernelGeometry):
        """Stride 1, centred kernel, output rows = input rows."""
        key = ("submanifold", src.id, geom)
        return self._cached(
            key, lambda: (self._build(src, src.coords, geom, False, "submanifold"), src)
        )[0]

    def transposed_kernel_relation(
        self, src: CoordinateSet, geom: KernelGeometry, dst: CoordinateSet | None = None
    ):
        """Transposed convolution onto dst, the recorded finer set, or s * input."""
        if dst is None:
            parent = self._parents.get((src.id, geom.stride))
            if parent is not None:
                dst, fwd_geom = parent
                if fwd_geom == geom:
                    # Same geometry as the encoder layer: its edges, roles swapped.
                    fwd = self._relations.get(("forward", dst.id, geom))
                    if fwd is not None:
                        key = ("transposed", src.id, dst.id, geom)
                        return self._cached(
                            key, lambda: (self._swapped(fwd[0], geom), dst)
                        )
            else:
                key = ("upsampled", src.id, geom.stride)

                def make_dst():
                    scale = mx.array([1, *geom.stride], dtype=mx.int32)
                    up = mx.contiguous(src.coords * scale)
                    stride = tuple(
                        a // b if a % b == 0 else 1 for a, b in zip(src.stride, geom.stride)
                    )
                    return None, self._new_set(up, stride, parent=src)

                dst = self._cached(key, make_dst)[1]
        key = ("transposed", src.id, dst.id, geom)
        return self._cached(key, lambda: (self._build(src, dst.coords, geom, True, "transposed"), dst))

    @staticmethod
    def _swapped(fwd: Relation, geom: KernelGeometry) -> Relation:
        backend = backends.get(fwd.backend)
        before = backend.syncs()
        rel = fwd.swapped("transposed", geom)
        _record_map("relation", backend, before, map_kind="transposed", n_in=rel.n_in, n_out=rel.n_out,
                    k=rel.kernel_volume, edges=rel.edges, geometry=geom.args(), swapped=True)
        return rel

    def generative_relation(self, src: CoordinateSet, geom: KernelGeometry):
        """Transposed convolution onto every reachable point (the set grows)."""
        key = ("generative", src.id, geom)

        def build():
            out = self._support(src, geom, generative=True)
            stride = tuple(a // b if a % b == 0 else 1 for a, b in zip(src.stride, geom.stride))
            out_set = self._new_set(out, stride, trusted=True, parent=src)
            return self._build(src, out, geom, True, "generative"), out_set

        return self._cached(key, build)

    def stats(self) -> dict:
        return {
            "coordinate_sets": len({s.id for s in self._sets.values()}),
            "relations": sum(1 for v in self._relations.values() if v[0] is not None),
            "builds": self.builds,
            "hits": self.hits,
            "build_seconds": self.build_seconds,
        }
