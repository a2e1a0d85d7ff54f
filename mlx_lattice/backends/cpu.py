"""The CPU backend: maps and products in the extension (src/cpu/), on any
machine MLX runs on."""

from __future__ import annotations

import platform

import mlx.core as mx

from .. import _ext
from .base import Views
from .native import NativeBackend


def cpu_name() -> str:
    """The CPU's model (and family / model numbers where /proc/cpuinfo has
    them)."""
    name = ""
    try:
        name = str(mx.device_info(mx.cpu).get("device_name", ""))
    except Exception:
        pass
    fam = model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k, v = k.strip(), v.strip()
                if k == "model name" and not name:
                    name = v
                elif k == "cpu family" and not fam:
                    fam = v
                elif k == "model" and not model:
                    model = v
                if not line.strip() and name:
                    break
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    return f"{name} (family {fam} model {model})" if fam and model else name


class CpuBackend(NativeBackend):
    name = "cpu"
    map_route = "cpu.hash_map"
    neighbor_routes = ("cpu.knn", "cpu.radius")  # _ext.knn_query, _ext.radius_query

    fused_norm_switch = "FUSED_ON_CPU"
    fused_adam_update = True
    scatter_add_in_row_order = True
    native_column_ops = True
    native_patch_attention = True

    def _probe(self) -> bool:
        return True

    def tier(self) -> str:
        return f"cpu:{_ext.cpu_isa()}"

    def device_name(self) -> str:
        return cpu_name()

    def threads(self) -> int:
        # the thread count may change between calls
        return _ext.num_threads()

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

    def flips_in_place(self, route, groups=1):
        # The gather-GEMM packs its weight panels through strides: a weight
        # read transposed or mirrored is a view. The grouped kernels read a
        # dense copy of it, made from a view mirrored, but a grouped
        # transposition exchanges blocks, not axes.
        return (groups == 1, True)

    def relation(self, table, out_coords, geometry, transposed, kind, out_table=None):
        # The output set's own table spares the tiled (size = stride) build
        # hashing the outputs again.
        native = _ext.build_relation(table, out_coords, *geometry, transposed, kind, out_table)
        return native, Views(native), None, None
