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

from . import _ext, diagnostics
from .relation import KernelGeometry, Relation


# Map-building routes of the registry (mlx_lattice/routes.py), by where the
# coordinates are hashed; "cuda.hash_map" is in mlx_lattice/cuda/routes.py.
# "metal.hash_map": mlx_lattice/metal_maps.py, when _metal_maps() holds.
MAP_ROUTES = {"cpu.hash_map": "map", "metal.hash_map": "map"}


def _cuda_maps() -> bool:
    """Whether map building runs on CUDA: the default device is a CUDA GPU."""
    if mx.default_device().type != mx.gpu:
        return False
    from .cuda import available

    return available()


def _metal_maps() -> bool:
    """Whether map building runs on Metal: the default device is a Metal GPU
    and this build has the Metal kernels."""
    from . import metal_maps

    return metal_maps.available()


def map_route() -> str:
    """The registry route that builds maps for sets registered now."""
    if _cuda_maps():
        return "cuda.hash_map"
    return "metal.hash_map" if _metal_maps() else "cpu.hash_map"


def _sync_count(route: str):
    """The host synchronisations a map route has made so far (None: its
    builder does not count them); the CPU builder makes none."""
    if route == "metal.hash_map":
        from . import metal_maps

        return metal_maps.SYNCS
    if route == "cuda.hash_map":
        from .cuda import maps

        return getattr(maps, "SYNCS", None)
    return 0


def _record_map(product: str, route: str, before, **fields) -> None:
    """The map record of a build that started at sync count ``before``."""
    after = _sync_count(route)
    syncs = None if before is None or after is None else after - before
    diagnostics.map_record(product, route, syncs=syncs, **fields)


def _route_of(s: "CoordinateSet") -> str:
    if s.metal_table is not None:
        return "metal.hash_map"
    return "cuda.hash_map" if s.gpu_table is not None else "cpu.hash_map"


class CoordinateSet:
    """One registered coordinate set (row order is the tensor's row order)."""

    _ids = itertools.count()

    def __init__(self, coords: mx.array, stride: tuple[int, int, int], source=None, trusted=False):
        self.id = next(CoordinateSet._ids)
        self.coords = coords
        self.source = source  # the array the user registered, if copied
        self.stride = stride
        # Hashing validates range and uniqueness up front: on the GPU when the
        # default device is a CUDA GPU (relations are then built there too).
        # An output support (``trusted``) is valid by construction: on CUDA
        # its table skips reading the error flags back (a synchronisation).
        self.gpu_table = None
        self.metal_table = None
        self._table = None
        route = map_route()
        before = _sync_count(route)
        if route == "cuda.hash_map":
            from .cuda import maps

            self.gpu_table = maps.CudaTable(coords, trusted=trusted)
        elif route == "metal.hash_map":
            from . import metal_maps

            self.metal_table = metal_maps.MetalTable(coords)
        else:
            self._table = _ext.CoordTable(coords)
        n = coords.shape[0]
        _record_map("table", route, before, map_kind=None, n_in=n, n_out=n, k=1, edges=0)
        self._batch_counts = None
        # Batch items declared beyond the last one holding a voxel (empty
        # trailing items): at least ``_declared_batches`` items, and at least
        # as many as the set it was derived from (a convolution's output
        # keeps its input's batch size).
        self._declared_batches = 0
        self._batch_parent = None
        self._manager = None  # weak reference to the owning manager

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

    def declare_batches(self, n: int) -> None:
        """Record that this set spans at least ``n`` batch items (the last
        ones may hold no voxel)."""
        if n > self._declared_batches:
            self._declared_batches = int(n)

    def _min_batches(self) -> int:
        n = self._declared_batches
        if self._batch_parent is not None:
            n = max(n, self._batch_parent._min_batches())
        return n

    def batch_counts(self) -> np.ndarray:
        """Rows per batch item, ``(num_batches,)`` int64 (zeros for empty items)."""
        if self._batch_counts is None:
            b = np.array(self.coords[:, 0]) if self.size else np.zeros(0, np.int32)
            self._batch_counts = np.bincount(b, minlength=int(b.max()) + 1 if b.size else 0).astype(np.int64)
        counts = self._batch_counts
        extra = self._min_batches() - len(counts)
        return np.pad(counts, (0, extra)) if extra > 0 else counts


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
            contiguous = mx.contiguous(coords)
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
        route = _route_of(src)
        before = _sync_count(route)
        rel = self._build_on(src, out_coords, geom, transposed, kind, out_set)
        _record_map("relation", route, before, map_kind=kind, n_in=rel.n_in, n_out=rel.n_out,
                    k=rel.kernel_volume, edges=rel.edges, geometry=geom.args())
        return rel

    def _build_on(self, src: CoordinateSet, out_coords, geom: KernelGeometry, transposed, kind, out_set=None):
        if src.metal_table is not None:
            return Relation(_metal_build(src, out_coords, geom, transposed, kind), geom, metal=True)
        if src.gpu_table is not None:
            from . import cuda

            build = cuda.find("cuda.hash_map", "map").run
            native, max_out, max_in, symmetric = build(src.gpu_table, out_coords, geom.args(), transposed, kind)
            return Relation(native, geom, gpu=True, max_neighbors=max_out, max_in_neighbors=max_in,
                            symmetric=symmetric)
        # The output set's own table, when it was hashed on the CPU, spares
        # the tiled (size = stride) build hashing the outputs again.
        out_table = out_set._table if out_set is not None else None
        native = _ext.build_relation(src.table, out_coords, *geom.args(), transposed, kind, out_table)
        return Relation(native, geom)

    @staticmethod
    def _support(src: CoordinateSet, geom: KernelGeometry, generative: bool):
        route = _route_of(src)
        before = _sync_count(route)
        out = CoordinateManager._support_on(src, geom, generative)
        _record_map("support", route, before, map_kind="generative" if generative else "forward",
                    n_in=src.size, n_out=out.shape[0], k=geom.volume, edges=0, geometry=geom.args())
        return out

    @staticmethod
    def _support_on(src: CoordinateSet, geom: KernelGeometry, generative: bool):
        if src.metal_table is not None:
            return _metal_support(src, geom, generative)
        if src.gpu_table is not None:
            from .cuda import maps

            fn = maps.generative_support if generative else maps.forward_support
            return fn(src.gpu_table, geom.args())
        fn = _ext.generative_support if generative else _ext.forward_support
        return fn(src.table, *geom.args())

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
        route = "metal.hash_map" if fwd.metal else "cuda.hash_map" if fwd.gpu else "cpu.hash_map"
        before = _sync_count(route)
        rel = fwd.swapped("transposed", geom)
        _record_map("relation", route, before, map_kind="transposed", n_in=rel.n_in, n_out=rel.n_out,
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


# ------------------------------------------------------------ Metal maps
def _metal_build(src: CoordinateSet, out_coords, geom: KernelGeometry, transposed, kind):
    """A native relation built by route metal.hash_map."""
    from . import metal_maps

    return metal_maps.build_relation(src.metal_table, out_coords, geom.args(), transposed, kind)


def _metal_support(src: CoordinateSet, geom: KernelGeometry, generative: bool):
    from . import metal_maps

    fn = metal_maps.generative_support if generative else metal_maps.forward_support
    return fn(src.metal_table, geom.args())
