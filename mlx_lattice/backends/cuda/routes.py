"""The CUDA route table: one entry per CUDA route of mlx_lattice/routes.py,
with the function that computes its product."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import mlx.core as mx

from . import jit, maps
from .kernels import (FILL_BLOCKS, ROW_TILE, _kernel, channel_tile, input_chunk, output_tile,
                      sorted_mma_shared_bytes, staged_chunk)
from .view import View


# A pointwise product (view None) has no edges: the kernels then read row i
# as its own edge, and the index arrays are one-element placeholders.
def _csr_edges(x, view: View | None):
    """(rows, CSR offsets, gathered rows, kernel offsets) of the output rows."""
    if view is None:
        empty = jit.constant(0)
        return x.shape[0], empty, empty, empty
    return (view.rows, *view.csr())


# The conv routes read the weight as autodiff.conv's ``flip`` says:
# (transposed, mirrored), w stored (K, B, A) when transposed.
NO_FLIP = (False, False)


def _conv_shape(x, w, flip) -> tuple[int, int, int]:
    """(K, A, B) of a product: x's A channels into B."""
    return w.shape[0], x.shape[1], w.shape[1] if flip[0] else w.shape[2]


def pointwise(x, w, view: None, flip=NO_FLIP):
    """x @ W[0] with mx.matmul (cuBLAS reads a transposed operand in
    place); the registry admits half precision only. W[0] as a view: an
    integer index would be a gather, a kernel MLX compiles at run time."""
    w0 = mx.squeeze(w, 0)
    return mx.matmul(x, mx.swapaxes(w0, 0, 1) if flip[0] else w0)


def pointwise_wgrad(x, ct, view: None, k):
    """dW[0] = x^T ct with mx.matmul (cuBLAS reads x transposed in place):
    a pointwise product's one offset, its rows the reduction; the registry
    admits half precision only."""
    return mx.matmul(mx.swapaxes(x, 0, 1), ct)[None]


def fetch_on_demand(x, w, view: View | None, flip=NO_FLIP):
    """One thread per (row, output channel) over the CSR edges (any view)."""
    k, a, b = _conv_shape(x, w, flip)
    rows, offsets, gather, kidx = _csr_edges(x, view)
    return _kernel("fetch_on_demand")(
        inputs=[x, w, offsets, gather, kidx, jit.params(rows, a, b, k, *flip)],
        template=[("T", x.dtype), ("POINTWISE", view is None)],
        grid=(max(rows * b, 1), 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(rows, b)], output_dtypes=[x.dtype],
    )[0]


@functools.lru_cache(maxsize=None)
def _plan_placeholders():
    """A pointwise product's stand-ins for the sorted plan's arrays (reorder,
    neighbour map, tile masks), never read: with their ranks and dtypes,
    so that it runs the same compiled kernels as the plans' products."""
    return (jit.constant(0), mx.array(np.zeros((1, 1), np.int32)), mx.array(np.zeros((1,), np.uint64)))


def sorted_mma(x, w, view: View | None, bn: int | None = None, ak: int | None = None, flip=NO_FLIP,
               tm: int | None = None):
    """Output-stationary implicit GEMM on tensor cores over the sorted plan;
    `bn` output channels per block, `ak` input channels staged at a time
    and `tm` rows per block (defaults: output_tile(B, row tiles),
    staged_chunk(A, bn, tm), ROW_TILE; see :func:`variants`). A pointwise
    product (view None) runs its rows in order, each its own input row: no
    plan, and one kernel where cuBLAS's matmul costs the host about five
    launches' time (cuda.pointwise_mma)."""
    k, a, b = _conv_shape(x, w, flip)
    if view is None:
        rows, pointwise = x.shape[0], True
        reorder, smap, masks = _plan_placeholders()
    else:
        plan = view.plan()
        rows, pointwise = view.rows, False
        reorder, smap, masks = plan.reorder_rows, plan.sorted_out_in_map, plan.tile_masks
    if tm is None:
        tm = ROW_TILE
    elif tm not in (64, 128):
        raise ValueError(f"TM={tm}: the sorted GEMM's row tile is 64 or 128")
    tiles = -(-rows // tm)
    bn = output_tile(b, tiles) if bn is None else _check_tile("BN", bn, b)
    ak = staged_chunk(a, bn, tm) if ak is None else _check_tile("AK", ak, a)
    return _kernel("sorted_mma", sorted_mma_shared_bytes(a, b, ak, bn, tm))(
        inputs=[x, w, reorder, smap, masks, jit.params(rows, a, b, k, *flip, pointwise)],
        template=[("T", x.dtype), ("AK", ak), ("BN", bn), ("TM", tm)],
        grid=(max(tiles, 1) * (b // bn) * 2 * tm, 1, 1), threadgroup=(2 * tm, 1, 1),
        output_shapes=[(rows, b)], output_dtypes=[x.dtype],
    )[0]


def direct_chunk(edges: int, a: int, b: int) -> int:
    """Edges per chunk of the direct weight gradients: 256, doubled while
    the float partial sums (A x B per chunk) would pass 2**22 values."""
    size = 256
    while (edges // size + 1) * a * b > 1 << 22 and size < edges:
        size *= 2
    return size


def _split_wgrad(name, x, ct, view: View | None, k, out_shape, template, params=()):
    """A direct weight gradient (`name`: wgrad_direct or grouped_wgrad) split
    over chunks of edges, then reduced per offset in chunk order."""
    ab = out_shape[1] * out_shape[2]
    n = x.shape[0] if view is None else view.rel.edges
    if n == 0:
        return mx.zeros(out_shape, dtype=x.dtype)
    size = direct_chunk(n, *out_shape[1:])
    if view is None:  # pointwise: rows in chunks of `size`, one offset
        slots = -(-n // size)
        chunks = gidx = ridx = jit.constant(0)  # placeholders
        first = jit.constant(0, slots)
    else:
        chunks, first, km = view.wgrad_chunks(size)
        slots, gidx, ridx = chunks.shape[0], km.in_idx, km.out_idx
    tpb = min(256, 32 * -(-ab // 32))
    partial = _kernel(name)(
        inputs=[x, ct, chunks, gidx, ridx, jit.params(n, *params, slots, size)],
        template=[("T", x.dtype), *template, ("POINTWISE", view is None)],
        grid=(slots * -(-ab // tpb) * tpb, 1, 1), threadgroup=(tpb, 1, 1),
        output_shapes=[(slots, *out_shape[1:])], output_dtypes=[mx.float32],
    )[0]
    return _reduce(partial, first, out_shape, x.dtype)


def _reduce(partial, first, out_shape, dtype):
    """dW (K, A, B) from per-chunk partial sums, each offset's in chunk order:
    the transposed view of a (B, K, A) array, the parameter's own layout."""
    k, a, b = out_shape
    return _kernel("wgrad_reduce")(
        inputs=[partial, first, jit.params(a, b, k)],
        template=[("T", dtype)],
        grid=(k * a * b, 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(b, k, a)], output_dtypes=[dtype],
    )[0].transpose(1, 2, 0)


def wgrad_direct(x, ct, view: View | None, k):
    """One thread per weight element over chunks of the kernel-major edges."""
    a, b = x.shape[1], ct.shape[1]
    return _split_wgrad("wgrad_direct", x, ct, view, k, (k, a, b), (), (a, b))


def wgrad_chunk(a: int, b: int, edges: int = 0, tiles: int = 1) -> int:
    """Edges per chunk of the tensor-core weight gradient: 256, longer for
    wider channels, so that the float partial sums stay within about as
    many bytes as 256-edge chunks of 128 x 128 channels; with the product's
    ``edges`` (and dW ``tiles`` per chunk), doubled while the longer chunks
    would still launch FILL_BLOCKS blocks: a layer with many edges then
    keeps the GPU as full with fewer float partial sums (A x B each: up to
    tens of MiB a layer, alive until reduced), and a shorter reduction."""
    size = 256 * max(1, (a * b) // (128 * 128))
    while (edges // (2 * size)) * tiles >= FILL_BLOCKS:
        size *= 2
    return size


def wgrad_mma(x, ct, view: View | None, k, ta: int | None = None, tb: int | None = None,
              chunk: int | None = None):
    """Per-offset x^T ct on tensor cores over chunks of edges, reduced in
    order; `ta` x `tb` of dW per block and `chunk` edges per chunk
    (defaults: channel_tile(A), channel_tile(B), wgrad_chunk(A, B, edges, tiles); see
    :func:`variants`)."""
    a, b = x.shape[1], ct.shape[1]
    edges = x.shape[0] if view is None else view.rel.edges
    if edges == 0:
        return mx.zeros((k, a, b), dtype=x.dtype)
    ta = channel_tile(a) if ta is None else _check_tile("TA", ta, a)
    tb = channel_tile(b) if tb is None else _check_tile("TB", tb, b)
    chunk = chunk or wgrad_chunk(a, b, edges, (a // ta) * (b // tb))
    if view is None:
        # A pointwise product (cuda.pointwise_wgrad_mma): its rows are the
        # edges of its one offset, chunk c rows [c * chunk, (c + 1) * chunk).
        n_chunks = -(-edges // chunk)
        first = jit.constant(0, n_chunks)
        gidx, chunks, _ = _plan_placeholders()  # never read
        ridx = gidx
    else:
        chunks, first, km = view.wgrad_chunks(chunk)
        n_chunks = chunks.shape[0]  # slots; the empty ones past first[K] are not reduced
        gidx, ridx = km.in_idx, km.out_idx
    partial = _kernel("wgrad_mma")(
        inputs=[x, ct, gidx, ridx, chunks, jit.params(a, b, view is None, edges, chunk)],
        template=[("T", x.dtype), ("TA", ta), ("TB", tb)],
        grid=(n_chunks * (a // ta) * (b // tb) * 128, 1, 1), threadgroup=(128, 1, 1),
        output_shapes=[(n_chunks, a, b)], output_dtypes=[mx.float32],
    )[0]
    return _reduce(partial, first, (k, a, b), x.dtype)


def grouped_fetch_on_demand(x, w, view: View | None, groups: int):
    """Grouped products: one thread per (row, output channel) over the CSR
    edges, reading the A / groups input channels of its group."""
    k, ag, b = w.shape
    rows, offsets, gather, kidx = _csr_edges(x, view)
    return _kernel("grouped_fetch_on_demand")(
        inputs=[x, w, offsets, gather, kidx, jit.params(rows)],
        template=[("T", x.dtype), ("A", x.shape[1]), ("AG", ag), ("B", b), ("G", groups),
                  ("POINTWISE", view is None)],
        grid=(max(rows * b, 1), 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(rows, b)], output_dtypes=[x.dtype],
    )[0]


def grouped_wgrad(x, ct, view: View | None, k, groups: int):
    """dW (K, A / groups, B) of a grouped product: one thread per element
    over chunks of the kernel-major edges."""
    a, b = x.shape[1], ct.shape[1]
    ag = a // groups
    return _split_wgrad("grouped_wgrad", x, ct, view, k, (k, ag, b),
                        (("A", a), ("AG", ag), ("B", b), ("G", groups)))


# ------------------------------------------------------------------ variants
def _tiles(c: int) -> list[int]:
    """The tiles a channel count can be cut into: multiples of 16 up to 128
    that divide it, largest first."""
    return [t for t in range(128, 15, -16) if c % t == 0]

# The sorted GEMM's variants keep within the larger of this and its default
# tiles' dynamic shared memory.
SHARED_LIMIT = 48 << 10


def _check_tile(name: str, tile: int, channels: int) -> int:
    """A tile asked for: a multiple of 16, at most 128, dividing the channels
    (the defaults, channel_tile and input_chunk, are such tiles)."""
    if not (isinstance(tile, int) and 16 <= tile <= 128 and tile % 16 == 0 and channels % tile == 0):
        raise ValueError(f"{name}={tile}: a tile must be a multiple of 16, at most 128, "
                         f"dividing {channels} channels")
    return tile


def variants(route: str, a: int, b: int) -> list[dict]:
    """The tile shapes `route` can run a product of A input and B output
    channels with, as keyword arguments of its function, the default ({})
    first. Only the tensor-core routes have any: cuda.sorted_mma (``bn``
    output channels per block, ``ak`` input channels staged at a time, ``tm``
    rows per block) and
    cuda.wgrad_mma (``ta`` x ``tb`` of dW per block, ``chunk`` edges per
    chunk); every other route runs one way."""
    out: list[dict] = [{}]
    if route == "cuda.sorted_mma" and a % 16 == 0 and b % 16 == 0:
        default = (channel_tile(b), input_chunk(a))
        limit = max(SHARED_LIMIT, sorted_mma_shared_bytes(a, b))
        # the default tiles with the other row tile
        out.append({"tm": 128 if ROW_TILE == 64 else 64})
        for bn in _tiles(b):
            for ak in _tiles(a):
                if (bn, ak) == default:
                    continue
                if sorted_mma_shared_bytes(a, b, ak, bn) <= limit:
                    out.append({"bn": bn, "ak": ak})
    elif route == "cuda.wgrad_mma" and a % 16 == 0 and b % 16 == 0:
        default = (channel_tile(a), channel_tile(b))
        base = wgrad_chunk(a, b)
        for ta in _tiles(a):
            for tb in _tiles(b):
                if (ta, tb) == default:
                    continue
                out.append({"ta": ta, "tb": tb})
        out += [{"chunk": base // 2}, {"chunk": base * 2}]
    return out


@dataclass(frozen=True)
class Route:
    op: str  # "conv": run(x, w, view); "weight_grad": run(x, ct, view, k);
    # "map": run(table, out_coords, geometry, transposed, kind, onto_support=False)
    #   -> (native relation, max output-row edges, max input-row edges, symmetric,
    #       the rows' (masks, sort keys) or None)
    run: Callable
    flipped: bool = False  # run reads a flipped weight in place (keyword flip)


ROUTES = {
    "cuda.pointwise_mma": Route("conv", sorted_mma, flipped=True),
    "cuda.pointwise": Route("conv", pointwise, flipped=True),
    "cuda.sorted_mma": Route("conv", sorted_mma, flipped=True),
    "cuda.fetch_on_demand": Route("conv", fetch_on_demand, flipped=True),
    "cuda.pointwise_wgrad_mma": Route("weight_grad", wgrad_mma),
    "cuda.pointwise_wgrad": Route("weight_grad", pointwise_wgrad),
    "cuda.wgrad_mma": Route("weight_grad", wgrad_mma),
    "cuda.wgrad_direct": Route("weight_grad", wgrad_direct),
    "cuda.grouped_fetch_on_demand": Route("conv", grouped_fetch_on_demand),  # grouped (the registry's): run
    "cuda.grouped_wgrad": Route("weight_grad", grouped_wgrad),  # takes groups as its last argument
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
