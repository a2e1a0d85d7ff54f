"""The route conditions the routes of several backends share (each backend's
routes: mlx_lattice/backends/<backend>_routes.py): a pointwise call, a dense
weight, the grid limits of the GPU neighbour queries."""

from __future__ import annotations

from .routes import Condition

KERNEL_1 = Condition("kernel 1x1x1", lambda c: c.kernel_size == (1, 1, 1))
STRIDE_1 = Condition("stride 1", lambda c: c.stride == (1, 1, 1))
NO_PAD_DIL = Condition(
    "no padding/dilation", lambda c: c.padding == (0, 0, 0) and c.dilation == (1, 1, 1)
)
NO_TARGET = Condition("no explicit target support", lambda c: not c.explicit_target)
FORWARD_KIND = Condition(
    "map kind forward or submanifold", lambda c: c.map_kind in ("forward", "submanifold")
)
DENSE = Condition("dense (unquantized) weight", lambda c: not c.quantized)

# k nearest and radius queries (mlx_lattice/neighbors.py): one route per
# backend and pass, each a key of its backend's neighbour_routes. The GPU
# routes share one grid (metal::neighbor_params, whose limits these
# conditions state); a query outside them runs on the CPU, on record.
NBR_ROWS = Condition(
    "at most 2^30 queries and 2^28 points", lambda c: c.n_out <= 1 << 30 and c.n_in <= 1 << 28
)
NBR_BATCHES = Condition("point batch indices below 2^20", lambda c: c.batches <= 1 << 20)
