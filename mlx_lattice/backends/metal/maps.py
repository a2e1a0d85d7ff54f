"""Map building on a Metal GPU (route ``metal.hash_map``): coordinate hash
tables, output supports, relations and everything a layer reads from a
relation (``out_idx``, the kernel-major and input-major views, the input
neighbour map, the swapped relation of a transposed convolution, the sorted
plan), from the programs of src/metal/map_build.cpp, each step an array of
the ``MetalMapStep`` primitive (``_ext.metal_map_step``) whose ``eval_gpu``
encodes the step's program.

The arrays equal the CPU builder's (src/cpu/coord_table.cpp, src/cpu/kernel_map.cpp,
src/core/relation.cpp) element for element. Sizes are decided on the host: a
coordinate set costs one synchronisation (the table's two error words), a
support one (its row count and error word), a relation one (its edge count,
between count and fill), a swapped relation one (its row offsets, which the
native relation reads for its statistics). The views cost none: their sizes
follow from the relation's, and they are handed to the native relation as
unevaluated arrays, computed on the GPU only when a route reads them (the
Metal routes take them from the native relation as primitive inputs). On an
error the CPU builder runs on the same input to raise its exact message.
``SYNCS`` counts the synchronisations, for the route log.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ... import _ext
from ..base import Views, symmetric_onto_itself

NONE = np.iinfo(np.int32).max  # an error word with nothing to report
_NO_GEOMETRY = ((1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1))
SYNCS = 0  # host synchronisations of map building so far (read by the manager's records)


def _read(a: mx.array) -> np.ndarray:
    """A read-back: one host synchronisation."""
    global SYNCS
    SYNCS += 1
    return np.array(a)


def _run(step: str, inputs: list, n_in: int, n_out: int, geometry, transposed: bool, edges: int) -> mx.array:
    """One step of the map programs on the default stream."""
    return _ext.metal_map_step(step, inputs, n_in, n_out, *geometry, transposed, edges)


def _int32_rows(a: mx.array, name: str) -> None:
    if not isinstance(a, mx.array) or a.ndim != 2 or a.shape[1] != 4 or a.dtype != mx.int32:
        raise ValueError(f"{name} must be an (N, 4) int32 array")


class MetalTable:
    """The GPU table of one coordinate set: slot rows, then the smallest
    duplicate row and the smallest out-of-range row."""

    def __init__(self, coords: mx.array):
        _int32_rows(coords, "coords")
        self.coords = coords
        self.size = n = coords.shape[0]
        if n > 2**30:
            raise ValueError(f"coords has {n} rows; the GPU table holds at most 2**30")
        self.table = None
        if n:
            self.table = _run("table", [coords], n, 0, _NO_GEOMETRY, False, 0)
            if (_read(self.table[-2:]) != NONE).any():  # the one synchronisation of a set
                _ext.CoordTable(coords)  # raises the CPU builder's message
                raise AssertionError("GPU table flagged coordinates the CPU table accepts")


def _support(table: MetalTable, geometry, generative: bool) -> mx.array:
    n, kv = table.size, int(np.prod(geometry[0]))
    if n == 0:
        return mx.zeros((0, 4), mx.int32)
    step = "generative_support" if generative else "forward_support"
    words = _run(step, [table.coords], n, 0, geometry, False, 0)
    count = n * kv
    rows, error = (int(v) for v in _read(words[count : count + 2]))  # the one synchronisation
    if error != NONE:
        fn = _ext.generative_support if generative else _ext.forward_support
        fn(_ext.CoordTable(table.coords), *geometry)  # raises the CPU builder's message
        raise AssertionError("GPU support flagged a range error the CPU builder accepts")
    if rows == 0:
        return mx.zeros((0, 4), mx.int32)
    return _run("support_fill", [words], n, 0, geometry, False, rows)


def forward_support(table: MetalTable, geometry) -> mx.array:
    """Every output a strided convolution reaches, sorted by packed key."""
    return _support(table, geometry, generative=False)


def generative_support(table: MetalTable, geometry) -> mx.array:
    """Every output a generative transposed convolution reaches, sorted."""
    return _support(table, geometry, generative=True)


def build_relation(table: MetalTable, out_coords: mx.array, geometry, transposed: bool, kind: str):
    """The native relation of ``_ext.build_relation``, built on the GPU with
    its neighbour map and views attached (``Plans.attach``)."""
    return build(table, out_coords, geometry, transposed, kind)[0]


def build(table: MetalTable, out_coords: mx.array, geometry, transposed: bool, kind: str):
    """(the native relation of ``build_relation``, its Plans)."""
    for k in geometry[0]:
        if k > 64:
            raise ValueError("kernel sizes above 64 are not supported")
    _int32_rows(out_coords, "output coordinates")
    n, m, kv = table.size, out_coords.shape[0], int(np.prod(geometry[0]))
    empty = mx.zeros((0,), mx.int32)
    if n == 0 or m == 0:
        native = _ext.Relation(kind, n, m, kv, _zeros(m + 1), empty, empty)
        native.set_neighbor_map(mx.full((m, kv), -1, mx.int32))
        return Plans(native, geometry).attach()
    ins = [table.coords, table.table, mx.contiguous(out_coords)]
    offsets = _run("count", ins, n, m, geometry, transposed, 0)
    edges = int(_read(offsets[m : m + 1])[0])  # the one synchronisation of a relation
    if edges:
        pairs = _run("fill", ins + [offsets], n, m, geometry, transposed, edges)
        in_idx, k_idx = mx.contiguous(pairs[0]), mx.contiguous(pairs[1])
        nmap = _run("neighbor_map", [offsets, in_idx, k_idx], n, m, geometry, False, edges)
    else:
        in_idx = k_idx = empty
        nmap = mx.full((m, kv), -1, mx.int32)
    # The offsets were evaluated by the read-back (the native relation reads
    # them for its statistics); the rest stays lazy, read only by primitives.
    native = _ext.Relation(kind, n, m, kv, offsets, in_idx, k_idx)
    native.set_neighbor_map(nmap)
    if symmetric_onto_itself(table, out_coords, geometry, transposed):
        native.set_symmetric()
    return Plans(native, geometry).attach()


def swapped(native, kind: str, geometry):
    """The relation with input and output roles exchanged (a transposed
    convolution with the geometry of a strided one), its views attached.
    ``native`` is a relation of ``build_relation`` (or of this function):
    the views it carries are reused, not made again."""
    plans = Plans(native, geometry)
    plans._cache["input_major"] = native.input_major()
    plans._cache["input_map"] = native.input_neighbor_map
    if native.kernel_volume <= 64:
        plans._cache["sorted_plan"] = native.sorted_plan()
    return plans.swapped(kind, geometry)[0]


class Plans(Views):
    """The derived arrays of one relation built on Metal, each an
    unevaluated array of the map programs made on first use and kept (the
    views of backends/base.py).
    ``attach()`` hands them all to the native relation, whose getters the
    routes read, so nothing is derived on the CPU. A view of a relation with
    no edges is made without a launch. The input-major program takes each
    (input row, offset) pair to have at most one edge, which holds when the
    output coordinates are unique (every set the manager registers is)."""

    def __init__(self, native, geometry):
        super().__init__(native)
        self.geometry = tuple(tuple(int(v) for v in g) for g in geometry)
        self.n_in, self.n_out = native.n_in, native.n_out
        self.k, self.edges = native.kernel_volume, native.edges
        if int(np.prod(self.geometry[0])) != self.k:
            raise ValueError(
                f"geometry kernel size {self.geometry[0]} does not match the relation's kernel volume {self.k}")

    def _run(self, step, inputs, n_in, n_out):
        return _run(step, inputs, n_in, n_out, self.geometry, False, self.edges)

    def _csr(self):
        return [self.native.out_offsets, self.native.in_idx, self.native.k_idx]

    def out_idx(self):
        def build():
            if self.edges == 0:
                return mx.zeros((0,), mx.int32)
            return self._run("out_idx", [self.native.out_offsets], self.n_in, self.n_out)
        return self._once("out_idx", build)

    def kernel_major(self):
        """(offsets (K+1), perm, in_idx, out_idx): edges by (offset, output row)."""
        def build():
            kv, e = self.k, self.edges
            if e == 0:
                empty = mx.zeros((0,), mx.int32)
                return _zeros(kv + 1), empty, empty, empty
            view = self._run("kernel_major", self._csr(), self.n_in, self.n_out)
            return _split(view, kv + 1, e)
        return self._once("kernel_major", build)

    def input_major(self):
        """(offsets (N_in+1), perm, out_idx, k_idx): edges by (input row, offset)."""
        def build():
            n, e = self.n_in, self.edges
            if e == 0:
                empty = mx.zeros((0,), mx.int32)
                return _zeros(n + 1), empty, empty, empty
            view = self._run("input_major", self._csr(), n, self.n_out)
            return _split(view, n + 1, e)
        return self._once("input_major", build)

    def input_map(self):
        """(N_in, K): the output row of edge (input row, offset), -1 where
        none: the neighbour map of the input-major view."""
        def build():
            if self.edges == 0:
                return mx.full((self.n_in, self.k), -1, mx.int32)
            offsets, _, out_idx, k_idx = self.input_major()
            return self._run("neighbor_map", [offsets, out_idx, k_idx], self.n_out, self.n_in)
        return self._once("input_map", build)

    def sorted_plan(self):
        """(reorder_rows, sorted_out_in_map, sorted_kv_out_in_map, tile_masks)."""
        def build():
            m, kv = self.n_out, self.k
            if kv > 64:
                raise ValueError("the sorted plan needs a kernel volume of at most 64")
            tiles = -(-m // _ext.Relation.plan_tile)
            if m == 0:
                return (mx.zeros((0,), mx.int32), mx.zeros((0, kv), mx.int32),
                        mx.zeros((kv, 0), mx.int32), mx.zeros((0,), mx.uint64))
            plan = _run("sorted_plan", [self.native.neighbor_map], 0, m, self.geometry, False, 0)
            masks, rows = plan[: 2 * tiles], plan[2 * tiles :]  # masks first: 8-byte aligned
            return (rows[:m], rows[m : m + m * kv].reshape(m, kv),
                    rows[m + m * kv :].reshape(kv, m), masks.view(mx.uint64))
        return self._once("sorted_plan", build)

    def input_order(self):
        """(N_in,): the input rows stably sorted by the mask of offsets their
        edges have (the row order of the input-major view): the sorted-plan
        program run on the input map, its rows kept."""
        def build():
            n = self.n_in
            if self.edges == 0:  # every mask empty: the rows in place
                # (no zero-length arange: MLX's CUDA backend hands NumPy a
                # null buffer for it, and np.array of it crashes)
                return mx.arange(n, dtype=mx.int32) if n else mx.zeros((0,), mx.int32)
            tiles = -(-n // _ext.Relation.plan_tile)
            plan = _run("sorted_plan", [self.input_map()], 0, n, self.geometry, False, 0)
            return plan[2 * tiles : 2 * tiles + n]
        return self._once("input_order", build)

    def attach(self):
        """Hands every view to the native relation (unevaluated); returns
        (the native relation, these Plans)."""
        rel = self.native
        rel.set_out_idx(self.out_idx())
        rel.set_kernel_major(*self.kernel_major())
        rel.set_input_major(*self.input_major())
        rel.set_input_neighbor_map(self.input_map())
        if self.k <= 64:  # otherwise the CPU's sorted_plan raises, as this one does
            rel.set_sorted_plan(*self.sorted_plan())
            # the row orders past 64 offsets are made on the host from the views
            rel.set_row_order(_ext.View.output_major, self.sorted_plan()[0])
            rel.set_row_order(_ext.View.input_major, self.input_order())
        return rel, self

    def swapped(self, kind: str, geometry=None):
        """(The native relation with roles exchanged, its Plans), views attached: its CSR
        arrays are this one's input-major view, its neighbour map this one's
        input map and its input map this one's neighbour map. Its row offsets
        are evaluated (one synchronisation): the native relation reads them."""
        global SYNCS
        offsets, _, out_idx, k_idx = self.input_major()
        if self.edges:
            mx.eval(offsets)
            SYNCS += 1
        native = _ext.Relation(kind, self.n_out, self.n_in, self.k, offsets, out_idx, k_idx)
        native.set_neighbor_map(self.input_map())
        plans = Plans(native, self.geometry)
        plans._cache["input_map"] = self.native.neighbor_map
        if self.k <= 64:  # its input rows are these output rows, offsets and all
            plans._cache["input_order"] = self.sorted_plan()[0]
        return plans.attach()


def _zeros(n: int) -> mx.array:
    """Zero offsets made on the host: evaluated without a synchronisation
    (the native relation reads its offsets)."""
    return mx.array(np.zeros(n, np.int32))


def _split(view: mx.array, head: int, e: int):
    """A view buffer (head offsets, then three arrays of e) as its arrays."""
    return view[:head], view[head : head + e], view[head + e : head + 2 * e], view[head + 2 * e :]
