"""What a layer needs beyond the relation, built on CUDA from its dense
neighbour map: the expanded output rows, the kernel-major and input-major
views, the swapped relation, the sorted plan and the weight-gradient chunks.

Every array equals the CPU one (src/core/relation.cpp) element for element. The
stable sorts of the CPU become ranks: an edge's place in the kernel-major
view is its offset's start plus the number of earlier rows that reach the
same offset (a column prefix sum of the hit map), and likewise per input row
for the input-major view; the row order of the sorted plan is an argsort of
keys made unique by the row index (a 32-bit mask digit per pass). Integer
prefix sums and unique-key sorts make the result independent of scheduling.
Nothing here reads data on the host.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from ... import _ext
from ..base import Views
from . import jit

# One thread per output row: the row of each of its edges.
OUT_IDX_SOURCE = """
  const long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= params[0]) return;
  for (int e = offsets[r]; e < offsets[r + 1]; ++e) out_idx[e] = (int)r;
"""

# One thread per (row, offset) hit: its place in the kernel-major view
# (offset start + earlier rows of the same offset); perm is the edge id
# (row start + earlier hits of the same row).
KERNEL_MAJOR_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int m = params[0];
  const int kv = params[1];
  if (idx >= (long)m * kv) return;
  const int p = nmap[idx];
  if (p < 0) return;
  const int r = (int)(idx / kv);
  const int k = (int)(idx % kv);
  const int pos = koffsets[k] + col_rank[idx];
  perm[pos] = offsets[r] + row_rank[idx];
  in_idx[pos] = p;
  out_idx[pos] = r;
"""

# One thread per (output row, offset) hit: the input row's entry of the
# input neighbour map (at most one output per input and offset). Starts at -1.
INPUT_MAP_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int m = params[0];
  const int kv = params[1];
  if (idx >= (long)m * kv) return;
  const int p = nmap[idx];
  if (p >= 0) in_map[(long)p * kv + idx % kv] = (int)(idx / kv);
"""

# One thread per (input row, offset) hit: its place in the input-major view.
INPUT_MAJOR_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int n = params[0];
  const int kv = params[1];
  if (idx >= (long)n * kv) return;
  const int q = in_map[idx];
  if (q < 0) return;
  const int i = (int)(idx / kv);
  const int k = (int)(idx % kv);
  const int pos = in_offsets[i] + in_rank[idx];
  perm[pos] = offsets[q] + row_rank[(long)q * kv + k];
  out_idx[pos] = q;
  k_idx[pos] = k;
"""

# One thread per output row: its neighbour bitmask and the first sort key
# (low 32 mask bits above the row index).
MASK_SOURCE = """
  const long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int m = params[0];
  const int kv = params[1];
  if (r >= m) return;
  unsigned long long bits = 0ull;
  for (int k = 0; k < kv; ++k) bits |= (unsigned long long)(nmap[r * kv + k] >= 0) << k;
  reinterpret_cast<unsigned long long*>(masks)[r] = bits;
  reinterpret_cast<unsigned long long*>(key)[r] = ((bits & 0xffffffffull) << 32) | (unsigned long long)r;
"""

# One thread per sorted place: the second key (high 32 mask bits above the
# place after the first pass), so that the second pass keeps the first's order.
HIGH_KEY_SOURCE = """
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= params[0]) return;
  const unsigned long long bits = reinterpret_cast<const unsigned long long*>(masks)[order[i]];
  reinterpret_cast<unsigned long long*>(key)[i] = ((bits >> 32) << 32) | (unsigned long long)i;
"""

# One thread per (sorted place, offset): the sorted map. Its offset-major
# layout (the plan's sorted_kv_out_in_map) is left to a lazy transpose, which
# no CUDA route reads: a training step never allocates it.
PLAN_GATHER_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int m = params[0];
  const int kv = params[1];
  if (idx >= (long)m * kv) return;
  const long i = idx / kv;
  const int k = (int)(idx % kv);
  const int v = nmap[(long)reorder[i] * kv + k];
  sorted_map[idx] = v;
"""

# One thread per tile: the OR of its rows' masks.
TILE_SOURCE = """
  const long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int m = params[0];
  const int tile = params[1];
  if (t >= (m + tile - 1) / tile) return;
  const unsigned long long* mk = reinterpret_cast<const unsigned long long*>(masks);
  unsigned long long bits = 0ull;
  const long end = min((long)m, (t + 1) * tile);
  for (long i = t * tile; i < end; ++i) bits |= mk[reorder[i]];
  reinterpret_cast<unsigned long long*>(tiles)[t] = bits;
"""

# One thread per chunk slot: [k, e0, e1] of the slot's chunk of kernel-major
# edges; slots past the last chunk are [-1, 0, 0] (empty).
CHUNKS_SOURCE = """
  const long c = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int slots = params[0];
  const int kv = params[1];
  const int size = params[2];
  if (c >= slots) return;
  if (c >= first[kv]) {
    chunks[3 * c] = -1; chunks[3 * c + 1] = 0; chunks[3 * c + 2] = 0;
    return;
  }
  int lo = 0, hi = kv;  // first[lo] <= c < first[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (first[mid] <= c) lo = mid; else hi = mid;
  }
  const int e0 = koffsets[lo] + (int)(c - first[lo]) * size;
  chunks[3 * c] = lo;
  chunks[3 * c + 1] = e0;
  chunks[3 * c + 2] = min(e0 + size, koffsets[lo + 1]);
"""


@functools.lru_cache(maxsize=None)
def _kernel(name: str):
    spec = {
        "out_idx": (["offsets", "params"], ["out_idx"], OUT_IDX_SOURCE),
        "kernel_major": (
            ["nmap", "offsets", "koffsets", "col_rank", "row_rank", "params"],
            ["perm", "in_idx", "out_idx"], KERNEL_MAJOR_SOURCE),
        "input_map": (["nmap", "params"], ["in_map"], INPUT_MAP_SOURCE),
        "input_major": (
            ["in_map", "offsets", "in_offsets", "in_rank", "row_rank", "params"],
            ["perm", "out_idx", "k_idx"], INPUT_MAJOR_SOURCE),
        "mask": (["nmap", "params"], ["masks", "key"], MASK_SOURCE),
        "high_key": (["masks", "order", "params"], ["key"], HIGH_KEY_SOURCE),
        "plan_gather": (["nmap", "reorder", "params"], ["sorted_map"], PLAN_GATHER_SOURCE),
        "tiles": (["masks", "reorder", "params"], ["tiles"], TILE_SOURCE),
        "chunks": (["first", "koffsets", "params"], ["chunks"], CHUNKS_SOURCE),
    }[name]
    return jit.kernel(
        name=f"mlx_lattice_plan_{name}", input_names=spec[0], output_names=spec[1], source=spec[2],
    )


def _launch(name, n, inputs, shapes, dtypes, init_value=None):
    # On the GPU stream whatever the default (see maps._launch).
    return jit.launch(_kernel(name), n, inputs, shapes, dtypes, init_value=init_value, stream=mx.gpu)


class Plans(Views):
    """The derived arrays of one relation built on CUDA, each made on first
    use from the dense neighbour map and kept (the views of
    backends/base.py).

    The relation with roles exchanged has its own Plans, made once and
    linked both ways: a decoder's transposed relation (the encoder's,
    swapped), the input gradients of both layers and the swapped relation
    swapped back all share two sets of derived arrays, whatever kind each
    is labelled with."""

    def __init__(self, native, swapped_of: "Plans | None" = None):
        super().__init__(native)
        self.n_in, self.n_out = native.n_in, native.n_out
        self.k, self.edges = native.kernel_volume, native.edges
        self._swapped = swapped_of

    @property
    def nmap(self):
        return self.native.neighbor_map

    def _row_rank(self):
        # Earlier hits in the same output row: the edge id within the row.
        return self._once(
            "row_rank", lambda: mx.cumsum((self.nmap >= 0).astype(mx.int32), axis=1, inclusive=False))

    def out_idx(self):
        def build():
            if self.edges == 0:
                return mx.zeros((0,), mx.int32)
            return _launch("out_idx", self.n_out, [self.native.out_offsets, jit.params(self.n_out)],
                           [(self.edges,)], [mx.int32])[0]
        return self._once("out_idx", build)

    def kernel_major(self):
        """(offsets (K+1), perm, in_idx, out_idx): edges by (offset, output row)."""
        def build():
            m, kv, e = self.n_out, self.k, self.edges
            if e == 0:  # no kernels on empty arrays
                empty = mx.zeros((0,), mx.int32)
                return mx.zeros((kv + 1,), mx.int32), empty, empty, empty
            hit = (self.nmap >= 0).astype(mx.int32)
            koffsets = mx.concatenate([mx.zeros((1,), mx.int32), mx.cumsum(hit.sum(axis=0))])
            col_rank = mx.cumsum(hit, axis=0, inclusive=False)
            perm, in_idx, out_idx = _launch(
                "kernel_major", m * kv,
                [self.nmap, self.native.out_offsets, koffsets, col_rank, self._row_rank(), jit.params(m, kv)],
                [(e,), (e,), (e,)], [mx.int32] * 3,
            )
            return koffsets, perm, in_idx, out_idx
        return self._once("kernel_major", build)

    def input_map(self):
        """(N_in, K): the output row of edge (input row, offset), -1 where none."""
        def build():
            m, kv = self.n_out, self.k
            if self.edges == 0:
                return mx.full((self.n_in, kv), -1, mx.int32)
            return _launch("input_map", m * kv, [self.nmap, jit.params(m, kv)],
                           [(self.n_in, kv)], [mx.int32], init_value=-1)[0]
        return self._once("input_map", build)

    def input_major(self):
        """(offsets (N_in+1), perm, out_idx, k_idx): edges by (input row, offset)."""
        def build():
            n, kv, e = self.n_in, self.k, self.edges
            if e == 0:
                empty = mx.zeros((0,), mx.int32)
                return mx.zeros((n + 1,), mx.int32), empty, empty, empty
            in_map = self.input_map()
            in_hit = (in_map >= 0).astype(mx.int32)
            in_offsets = mx.concatenate([mx.zeros((1,), mx.int32), mx.cumsum(in_hit.sum(axis=1))])
            in_rank = mx.cumsum(in_hit, axis=1, inclusive=False)
            perm, out_idx, k_idx = _launch(
                "input_major", n * kv,
                [in_map, self.native.out_offsets, in_offsets, in_rank, self._row_rank(), jit.params(n, kv)],
                [(e,), (e,), (e,)], [mx.int32] * 3,
            )
            return in_offsets, perm, out_idx, k_idx
        return self._once("input_major", build)

    def swapped(self, kind: str, geometry=None):
        """(the native relation with roles exchanged, labelled `kind`, and its
        Plans). Its neighbour map is this one's input map; its arrays stay
        lazy (no synchronisation): a host read through the native relation
        evaluates them first."""
        if self._swapped is None:
            offsets, _, out_idx, k_idx = self.input_major()
            native = _ext.Relation(kind, self.n_out, self.n_in, self.k, offsets, out_idx, k_idx)
            native.set_neighbor_map(self.input_map())
            self._swapped = Plans(native, swapped_of=self)
        other = self._swapped
        native = other.native
        if native.kind != kind:  # the same arrays under another label
            native = _ext.Relation(kind, other.n_in, other.n_out, other.k, native.out_offsets,
                                   native.in_idx, native.k_idx)
            native.set_neighbor_map(other.nmap)
        return native, other

    def sorted_plan(self):
        """(reorder_rows, sorted_out_in_map, sorted_kv_out_in_map, tile_masks)."""
        def build():
            m, kv = self.n_out, self.k
            if kv > 64:
                raise ValueError("the sorted plan needs a kernel volume of at most 64")
            tile = _ext.Relation.plan_tile
            if m == 0:
                return (mx.zeros((0,), mx.int32), mx.zeros((0, kv), mx.int32),
                        mx.zeros((kv, 0), mx.int32), mx.zeros((0,), mx.uint64))
            masks, key = _launch("mask", m, [self.nmap, jit.params(m, kv)], [(m,), (m,)], [mx.uint64] * 2)
            order = mx.argsort(key).astype(mx.int32)  # unique keys: a stable sort by the low bits
            if kv > 32:
                key = _launch("high_key", m, [masks, order, jit.params(m)], [(m,)], [mx.uint64])[0]
                order = order[mx.argsort(key).astype(mx.int32)]
            sorted_map = _launch(
                "plan_gather", m * kv, [self.nmap, order, jit.params(m, kv)], [(m, kv)], [mx.int32])[0]
            kv_map = mx.swapaxes(sorted_map, 0, 1)
            n_tiles = -(-m // tile)
            tiles = _launch("tiles", n_tiles, [masks, order, jit.params(m, tile)], [(n_tiles,)], [mx.uint64])[0]
            return order, sorted_map, kv_map, tiles
        return self._once("sorted_plan", build)


def wgrad_chunks(koffsets: mx.array, edges: int, k: int, size: int = 256):
    """Chunks of at most `size` kernel-major edges of one offset:
    ((slots, 3) [k, e0, e1], first chunk per offset (K+1)). The chunk count is
    not read back: there are edges // size + K slots (at least as many as
    chunks), the ones past ``first[K]`` empty."""
    counts = koffsets[1:] - koffsets[:-1]
    first = mx.concatenate([mx.zeros((1,), mx.int32), mx.cumsum((counts + size - 1) // size)])
    slots = edges // size + k
    chunks = _launch("chunks", slots, [first, koffsets, jit.params(slots, k, size)],
                     [(slots, 3)], [mx.int32])[0]
    return chunks, first
