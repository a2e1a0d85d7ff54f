"""Map building on a Metal GPU (route ``metal.hash_map``): coordinate hash
tables, output supports and relations from the programs of
src/metal/map_build.cpp, each step an array of the ``MetalMapStep``
primitive (``_ext.metal_map_step``) whose ``eval_gpu`` encodes the step's
program.

The arrays equal the CPU builder's (src/coord_table.cpp, src/kernel_map.cpp)
element for element. Sizes are decided on the host: a coordinate set costs
one synchronisation (the table's two error words), a support one (its row
count and error word), a relation one (its edge count, between count and
fill). On an error the CPU builder runs on the same input to raise its exact
message.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from . import _ext

NONE = np.iinfo(np.int32).max  # an error word with nothing to report
_NO_GEOMETRY = ((1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1))


def available() -> bool:
    """Whether maps are built on Metal: the default device is a GPU, MLX runs
    Metal and this build has the Metal kernels."""
    return mx.default_device().type == mx.gpu and mx.metal.is_available() and _ext.metal_available()


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
            if (np.array(self.table[-2:]) != NONE).any():  # the one synchronisation of a set
                _ext.CoordTable(coords)  # raises the CPU builder's message
                raise AssertionError("GPU table flagged coordinates the CPU table accepts")


def _support(table: MetalTable, geometry, generative: bool) -> mx.array:
    n, kv = table.size, int(np.prod(geometry[0]))
    if n == 0:
        return mx.zeros((0, 4), mx.int32)
    step = "generative_support" if generative else "forward_support"
    words = _run(step, [table.coords], n, 0, geometry, False, 0)
    count = n * kv
    rows, error = (int(v) for v in np.array(words[count : count + 2]))  # the one synchronisation
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
    its neighbour map attached."""
    for k in geometry[0]:
        if k > 64:
            raise ValueError("kernel sizes above 64 are not supported")
    _int32_rows(out_coords, "output coordinates")
    n, m, kv = table.size, out_coords.shape[0], int(np.prod(geometry[0]))
    empty = mx.zeros((0,), mx.int32)
    if n == 0 or m == 0:
        native = _ext.Relation(kind, n, m, kv, mx.zeros((m + 1,), mx.int32), empty, empty)
        native.set_neighbor_map(mx.full((m, kv), -1, mx.int32))
        return native
    ins = [table.coords, table.table, mx.contiguous(out_coords)]
    offsets = _run("count", ins, n, m, geometry, transposed, 0)
    edges = int(np.array(offsets[m : m + 1])[0])  # the one synchronisation of a relation
    if edges:
        pairs = _run("fill", ins + [offsets], n, m, geometry, transposed, edges)
        in_idx, k_idx = mx.contiguous(pairs[0]), mx.contiguous(pairs[1])
        nmap = _run("neighbor_map", [offsets, in_idx, k_idx], n, m, geometry, False, edges)
    else:
        in_idx = k_idx = empty
        nmap = mx.full((m, kv), -1, mx.int32)
    mx.eval(offsets, in_idx, k_idx, nmap)
    native = _ext.Relation(kind, n, m, kv, offsets, in_idx, k_idx)
    native.set_neighbor_map(nmap)
    return native
