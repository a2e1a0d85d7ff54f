"""The CPU backend: maps and products in the extension (src/cpu/), on any
machine MLX runs on."""

from __future__ import annotations

import mlx.core as mx

from .. import _ext
from .base import Backend, Views


class CpuBackend(Backend):
    name = "cpu"
    map_route = "cpu.hash_map"
    neighbor_routes = ("cpu.knn", "cpu.radius")  # _ext.knn_query, _ext.radius_query

    def _probe(self) -> bool:
        return True

    def tier(self) -> str:
        return f"cpu:{_ext.cpu_isa()}"

    def stream(self):
        return mx.default_stream(mx.cpu)

    def table(self, coords, trusted=False):
        return _ext.CoordTable(coords)

    def support(self, table, geometry, generative):
        fn = _ext.generative_support if generative else _ext.forward_support
        return fn(table, *geometry)

    def product_weight(self, weight):
        # The parameter itself: the routes read it in place and write its
        # gradient in its layout (no transpose or reshape in the graph).
        return weight

    def reads_parameter(self, route):
        return True

    def reads_flipped(self, route):
        # The gather-GEMM packs its weight panels through strides: a weight
        # read transposed or mirrored is a view (the grouped kernels read a
        # dense one).
        return ".grouped_" not in route

    def relation(self, table, out_coords, geometry, transposed, kind, out_table=None):
        # The output set's own table spares the tiled (size = stride) build
        # hashing the outputs again.
        native = _ext.build_relation(table, out_coords, *geometry, transposed, kind, out_table)
        return native, Views(native), None, None, False
