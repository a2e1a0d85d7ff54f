"""What a layer needs beyond the relation, built on CUDA from its dense
neighbour map: the expanded output rows, the kernel-major and input-major
views, the swapped relation, the sorted plan and the weight-gradient chunks.

Every array equals the CPU one (src/core/relation.cpp) element for element. The
stable sorts of the CPU become ranks: an edge's place in the kernel-major
view is its offset's start plus the number of earlier rows that reach the
same offset (a column prefix sum of the hit map), and in the input-major
view its input row's start plus the row's earlier hits (one thread per row
walks them in order); the row order of the sorted plan is an argsort of
keys made unique by the row index (a 32-bit mask digit per pass), the keys
and masks coming from the relation's row summary (maps.row_summary).
Integer prefix sums and unique-key sorts make the result independent of
scheduling. Nothing here reads data on the host; each view is one or two
kernels beside MLX's scan or sort.
"""

from __future__ import annotations

import weakref

import mlx.core as mx

from ... import _ext
from ..base import Views
from . import jit, maps

# One thread per output row: the row of each of its edges.
OUT_IDX_SOURCE = """
  const long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= params[0]) return;
  for (int e = offsets[r]; e < offsets[r + 1]; ++e) out_idx[e] = (int)r;
"""

# One thread per (offset, output row): the hit map transposed, (K, M), so
# that the count of earlier rows reaching each offset is a scan along rows
# (MLX scans a contiguous axis fast, a strided one many times slower).
HITS_T_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int m = params[0];
  const int kv = params[1];
  if (idx >= (long)m * kv) return;
  const long k = idx / m;
  const long r = idx % m;
  hits_t[idx] = nmap[r * kv + k] >= 0 ? 1 : 0;
"""

# One thread per output row: its edges at their kernel-major places, the
# offset's start plus the earlier rows reaching the offset (colinc, the
# inclusive count of hits along each offset's row of hits_t, less one);
# perm is the edge id (the row's start plus its earlier hits). The
# offsets' starts are the totals (colinc's last column) summed as the
# thread walks the offsets; row 0 writes them out.
KERNEL_MAJOR_SOURCE = """
  const long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int m = params[0];
  const int kv = params[1];
  if (r >= m) return;
  int start = 0, e = offsets[r];
  for (int k = 0; k < kv; ++k) {
    if (r == 0) koffsets[k] = start;
    const int p = nmap[r * kv + k];
    if (p >= 0) {
      const int pos = start + colinc[(long)k * m + r] - 1;
      perm[pos] = e++;
      in_idx[pos] = p;
      out_idx[pos] = (int)r;
    }
    start += colinc[(long)k * m + m - 1];
  }
  if (r == 0) koffsets[kv] = start;
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

# One thread per input row: its edges in offset order from its start; perm
# is the edge id in the output-major relation (the output row's start plus
# that row's hits before the offset, counted in the neighbour map).
INPUT_MAJOR_SOURCE = """
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int n = params[0];
  const int kv = params[1];
  if (i >= n) return;
  int e = in_offsets[i];
  for (int k = 0; k < kv; ++k) {
    const int q = in_map[i * kv + k];
    if (q < 0) continue;
    const int* row = nmap + (long)q * kv;
    int rank = 0;
    for (int j = 0; j < k; ++j) rank += row[j] >= 0;
    perm[e] = offsets[q] + rank;
    out_idx[e] = q;
    k_idx[e] = k;
    ++e;
  }
"""

# One thread per sorted place: the second key (high 32 mask bits above the
# place after the first pass), so that the second pass keeps the first's order.
HIGH_KEY_SOURCE = """
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= params[0]) return;
  const unsigned long long bits = reinterpret_cast<const unsigned long long*>(masks)[order[i]];
  reinterpret_cast<unsigned long long*>(key)[i] = ((bits >> 32) << 32) | (unsigned long long)i;
"""

# One thread per (sorted place, offset): the sorted map; each place's first
# thread ORs its row's mask into its tile's (tiles start at 0: OR commutes,
# so the result does not depend on scheduling). The map's offset-major
# layout (the plan's sorted_kv_out_in_map) is left to a lazy transpose,
# which no CUDA route reads: a training step never allocates it.
PLAN_GATHER_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int m = params[0];
  const int kv = params[1];
  const int tile = params[2];
  if (idx >= (long)m * kv) return;
  const long i = idx / kv;
  const int k = (int)(idx % kv);
  const long q = reorder[i];
  sorted_map[idx] = nmap[q * kv + k];
  if (k == 0) {
    atomicOr(reinterpret_cast<unsigned long long*>(tiles) + i / tile,
             reinterpret_cast<const unsigned long long*>(masks)[q]);
  }
"""

# One thread per chunk slot: [k, e0, e1] of the slot's chunk of kernel-major
# edges (each offset's edges in chunks of `size`, in order); slots past the
# last chunk are [-1, 0, 0] (empty). Slot 0 writes first (the first chunk
# of each offset, K + 1 values), which every slot counts for itself.
CHUNKS_SOURCE = """
  const long c = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int slots = params[0];
  const int kv = params[1];
  const int size = params[2];
  if (c >= slots) return;
  int start = 0, lo = -1, base = 0;
  for (int k = 0; k < kv; ++k) {
    const int n = (koffsets[k + 1] - koffsets[k] + size - 1) / size;
    if (c == 0) first[k] = start;
    if (lo < 0 && c < start + n) {
      lo = k;
      base = start;
    }
    start += n;
  }
  if (c == 0) first[kv] = start;
  if (lo < 0) {
    chunks[3 * c] = -1; chunks[3 * c + 1] = 0; chunks[3 * c + 2] = 0;
    return;
  }
  const int e0 = koffsets[lo] + (int)(c - base) * size;
  chunks[3 * c] = lo;
  chunks[3 * c + 1] = e0;
  chunks[3 * c + 2] = min(e0 + size, koffsets[lo + 1]);
"""


# On the GPU stream whatever the default (see maps._kernel).
_kernel = jit.Family("mlx_lattice_plan_", {
    "out_idx": (["offsets", "params"], ["out_idx"], OUT_IDX_SOURCE),
    "hits_t": (["nmap", "params"], ["hits_t"], HITS_T_SOURCE),
    "kernel_major": (
        ["nmap", "offsets", "colinc", "params"], ["koffsets", "perm", "in_idx", "out_idx"],
        KERNEL_MAJOR_SOURCE),
    "input_map": (["nmap", "params"], ["in_map"], INPUT_MAP_SOURCE),
    "input_major": (
        ["in_map", "nmap", "offsets", "in_offsets", "params"], ["perm", "out_idx", "k_idx"],
        INPUT_MAJOR_SOURCE),
    "high_key": (["masks", "order", "params"], ["key"], HIGH_KEY_SOURCE),
    "plan_gather": (["nmap", "reorder", "masks", "params"], ["sorted_map", "tiles"], PLAN_GATHER_SOURCE),
    "chunks": (["koffsets", "params"], ["chunks", "first"], CHUNKS_SOURCE),
}, stream=mx.gpu)
_launch = _kernel.launch


class Plans(Views):
    """The derived arrays of one relation built on CUDA, each made on first
    use from the dense neighbour map and kept (the views of
    backends/base.py).

    The relation with roles exchanged has its own Plans, made once and
    linked both ways: a decoder's transposed relation (the encoder's,
    swapped), the input gradients of both layers and the swapped relation
    swapped back all share two sets of derived arrays, whatever kind each
    is labelled with. The link from the swapped Plans back is weak (no
    reference cycle holds a sample's maps after its last user)."""

    def __init__(self, native, swapped_of: "Plans | None" = None, rows=None):
        super().__init__(native)
        self.n_in, self.n_out = native.n_in, native.n_out
        self.k, self.edges = native.kernel_volume, native.edges
        self._swapped = None  # the swapped Plans, made by swapped()
        self._swapped_of = None if swapped_of is None else weakref.ref(swapped_of)
        # (masks, first sort keys) of the rows, from the row summary that
        # built the relation (maps.row_summary), else made on first use
        self._rows = rows
        self._in_rows = None  # the same of the input rows (the swapped relation's)

    @property
    def nmap(self):
        return self.native.neighbor_map

    def _masks(self):
        if self._rows is None:
            self._rows = maps.row_summary(self.nmap)[2]
        return self._rows

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
            hits_t = _launch("hits_t", m * kv, [self.nmap, jit.params(m, kv)], [(kv, m)], [mx.int32])[0]
            colinc = mx.cumsum(hits_t, axis=1)
            return tuple(_launch(
                "kernel_major", m, [self.nmap, self.native.out_offsets, colinc, jit.params(m, kv)],
                [(kv + 1,), (e,), (e,), (e,)], [mx.int32] * 4,
            ))
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
            counts, _, self._in_rows = maps.row_summary(in_map)
            in_offsets = mx.cumsum(counts)
            perm, out_idx, k_idx = _launch(
                "input_major", n,
                [in_map, self.nmap, self.native.out_offsets, in_offsets, jit.params(n, kv)],
                [(e,), (e,), (e,)], [mx.int32] * 3,
            )
            return in_offsets, perm, out_idx, k_idx
        return self._once("input_major", build)

    def swapped(self, kind: str, geometry=None):
        """(the native relation with roles exchanged, labelled `kind`, and its
        Plans). Its neighbour map is this one's input map; its arrays stay
        lazy (no synchronisation): a host read through the native relation
        evaluates them first."""
        other = self._swapped
        if other is None and self._swapped_of is not None:
            other = self._swapped_of()  # the Plans this one swaps, while it lives
        if other is None:
            offsets, _, out_idx, k_idx = self.input_major()
            native = _ext.Relation(kind, self.n_out, self.n_in, self.k, offsets, out_idx, k_idx)
            native.set_neighbor_map(self.input_map())
            other = self._swapped = Plans(native, swapped_of=self, rows=self._in_rows)
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
            masks, key = self._masks()
            order = mx.argsort(key).astype(mx.int32)  # unique keys: a stable sort by the low bits
            if kv > 32:
                key = _launch("high_key", m, [masks, order, jit.params(m)], [(m,)], [mx.uint64])[0]
                order = order[mx.argsort(key).astype(mx.int32)]
            n_tiles = -(-m // tile)
            sorted_map, tiles = _launch(
                "plan_gather", m * kv, [self.nmap, order, masks, jit.params(m, kv, tile)],
                [(m, kv), (n_tiles,)], [mx.int32, mx.uint64], init_value=0)
            return order, sorted_map, mx.swapaxes(sorted_map, 0, 1), tiles
        return self._once("sorted_plan", build)


def wgrad_chunks(koffsets: mx.array, edges: int, k: int, size: int = 256):
    """Chunks of at most `size` kernel-major edges of one offset:
    ((slots, 3) [k, e0, e1], first chunk per offset (K+1)), one kernel. The
    chunk count is not read back: there are edges // size + K slots (at
    least as many as chunks), the ones past ``first[K]`` empty."""
    slots = edges // size + k
    chunks, first = _launch("chunks", slots, [koffsets, jit.params(slots, k, size)],
                            [(slots, 3), (k + 1,)], [mx.int32, mx.int32])
    return chunks, first
