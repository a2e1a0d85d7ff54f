"""The CUDA route table: one entry per CUDA route of mlx_lattice/routes.py,
with the function that computes its product."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import mlx.core as mx

from . import maps
from .kernels import _kernel, channel_tile, input_chunk, sorted_mma_shared_bytes
from .view import View


def _params(*vals):
    return mx.array(np.array(vals, dtype=np.int32))


# A pointwise product (view None) has no edges: the kernels then read row i
# as its own edge, and the index arrays are one-element placeholders.
def _csr_edges(x, view: View | None):
    """(rows, CSR offsets, gathered rows, kernel offsets) of the output rows."""
    if view is None:
        empty = mx.zeros((1,), mx.int32)
        return x.shape[0], empty, empty, empty
    return (view.rows, *view.csr())


def _kernel_major_edges(x, view: View | None):
    """(kernel offsets, input rows, output rows, pointwise rows) of a weight gradient."""
    if view is None:
        empty = mx.zeros((1,), mx.int32)
        return empty, empty, empty, x.shape[0]
    km = view.rel.kernel_major()
    return km.offsets, km.in_idx, km.out_idx, 0


def pointwise(x, w, view: None):
    """x @ W[0] with mx.matmul (cuBLAS); the registry admits half precision only."""
    return mx.matmul(x, w[0])


def fetch_on_demand(x, w, view: View | None):
    """One thread per (row, output channel) over the CSR edges (any view)."""
    k, a, b = w.shape
    rows, offsets, gather, kidx = _csr_edges(x, view)
    return _kernel("fetch_on_demand")(
        inputs=[x, w, offsets, gather, kidx, _params(rows)],
        template=[("T", x.dtype), ("A", a), ("B", b), ("POINTWISE", view is None)],
        grid=(max(rows * b, 1), 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(rows, b)], output_dtypes=[x.dtype],
    )[0]


def sorted_mma(x, w, view: View):
    """Output-stationary implicit GEMM on tensor cores over the sorted plan."""
    k, a, b = w.shape
    plan = view.plan()
    rows = view.rows
    tiles = -(-rows // 64)
    bn = channel_tile(b)
    return _kernel("sorted_mma", sorted_mma_shared_bytes(a, b))(
        inputs=[x, w, plan.reorder_rows, plan.sorted_out_in_map, plan.tile_masks, _params(rows)],
        template=[("T", x.dtype), ("A", a), ("B", b), ("K", k), ("AK", input_chunk(a)), ("BN", bn)],
        grid=(max(tiles, 1) * (b // bn) * 128, 1, 1), threadgroup=(128, 1, 1),
        output_shapes=[(rows, b)], output_dtypes=[x.dtype],
    )[0]


def wgrad_direct(x, ct, view: View | None, k):
    """One thread per weight element over the kernel-major edges."""
    a, b = x.shape[1], ct.shape[1]
    ko, gi, ri, n = _kernel_major_edges(x, view)
    return _kernel("wgrad_direct")(
        inputs=[x, ct, ko, gi, ri, _params(n)],
        template=[("T", x.dtype), ("A", a), ("B", b), ("K", k), ("POINTWISE", view is None)],
        grid=(max(k * a * b, 1), 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(k, a, b)], output_dtypes=[x.dtype],
    )[0]


def wgrad_mma(x, ct, view: View | None, k):
    """Per-offset x^T ct on tensor cores over 256-edge chunks, reduced in order."""
    if view is None:
        # A pointwise product has no kernel-major chunks: its single offset
        # is the direct kernel's x^T ct.
        return wgrad_direct(x, ct, view, k)
    a, b = x.shape[1], ct.shape[1]
    if view.rel.edges == 0:
        return mx.zeros((k, a, b), dtype=x.dtype)
    # Wider channels take longer chunks, so that the float partial sums stay
    # within about as many bytes as 256-edge chunks of 128 x 128 channels.
    chunks, first, km = view.wgrad_chunks(256 * max(1, (a * b) // (128 * 128)))
    n_chunks = chunks.shape[0]  # slots; the empty ones past first[K] are not reduced
    ta, tb = channel_tile(a), channel_tile(b)
    partial = _kernel("wgrad_mma")(
        inputs=[x, ct, km.in_idx, km.out_idx, chunks],
        template=[("T", x.dtype), ("A", a), ("B", b), ("TA", ta), ("TB", tb)],
        grid=(n_chunks * (a // ta) * (b // tb) * 128, 1, 1), threadgroup=(128, 1, 1),
        output_shapes=[(n_chunks, a, b)], output_dtypes=[mx.float32],
    )[0]
    return _kernel("wgrad_reduce")(
        inputs=[partial, first],
        template=[("T", x.dtype), ("A", a), ("B", b), ("K", k)],
        grid=(k * a * b, 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(k, a, b)], output_dtypes=[x.dtype],
    )[0]


def grouped_fetch_on_demand(x, w, view: View | None, groups: int):
    """Grouped products: one thread per (row, output channel) over the CSR
    edges, reading the A / groups input channels of its group."""
    k, ag, b = w.shape
    rows, offsets, gather, kidx = _csr_edges(x, view)
    return _kernel("grouped_fetch_on_demand")(
        inputs=[x, w, offsets, gather, kidx, _params(rows)],
        template=[("T", x.dtype), ("A", x.shape[1]), ("AG", ag), ("B", b), ("G", groups),
                  ("POINTWISE", view is None)],
        grid=(max(rows * b, 1), 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(rows, b)], output_dtypes=[x.dtype],
    )[0]


def grouped_wgrad(x, ct, view: View | None, k, groups: int):
    """dW (K, A / groups, B) of a grouped product: one thread per element."""
    a, b = x.shape[1], ct.shape[1]
    ag = a // groups
    ko, gi, ri, n = _kernel_major_edges(x, view)
    return _kernel("grouped_wgrad")(
        inputs=[x, ct, ko, gi, ri, _params(n)],
        template=[("T", x.dtype), ("A", a), ("AG", ag), ("B", b), ("G", groups), ("K", k),
                  ("POINTWISE", view is None)],
        grid=(max(k * ag * b, 1), 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(k, ag, b)], output_dtypes=[x.dtype],
    )[0]


@dataclass(frozen=True)
class Route:
    op: str  # "conv": run(x, w, view); "weight_grad": run(x, ct, view, k);
    # "map": run(table, out_coords, geometry, transposed, kind)
    #   -> (native relation, max output-row edges, max input-row edges, symmetric)
    run: Callable
    grouped: bool = False  # run takes groups as its last argument


ROUTES = {
    "cuda.pointwise": Route("conv", pointwise),
    "cuda.sorted_mma": Route("conv", sorted_mma),
    "cuda.fetch_on_demand": Route("conv", fetch_on_demand),
    "cuda.wgrad_mma": Route("weight_grad", wgrad_mma),
    "cuda.wgrad_direct": Route("weight_grad", wgrad_direct),
    "cuda.grouped_fetch_on_demand": Route("conv", grouped_fetch_on_demand, grouped=True),
    "cuda.grouped_wgrad": Route("weight_grad", grouped_wgrad, grouped=True),
    "cuda.hash_map": Route("map", maps.build),
}


def find(name: str, op: str) -> Route:
    """The entry of `name`, which must be a CUDA route of `op`."""
    route = ROUTES.get(name)
    if route is None:
        raise ValueError(f"no CUDA route named {name!r}")
    if route.op != op:
        raise ValueError(f"route {name!r} computes a {route.op} product, not {op}")
    return route
