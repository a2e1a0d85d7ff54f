"""Map building on CUDA: coordinate hash tables, output supports and
relations, as ``mx.fast.cuda_kernel`` sources.

The arrays equal the CPU builder's (src/cpu/coord_table.cpp, src/cpu/kernel_map.cpp)
element for element: edges in (output row, offset) order, supports sorted by
packed key. Sizes are unknown before building, so each map is count-then-fill
with one host synchronisation (the edge or support count, read together with
the error flags and, for a relation, its largest rows); a coordinate set given
by the user costs one synchronisation (its error flags), a set made here (an
output support) none, since it is valid by construction. Every host read goes
through ``_read``, which counts them: ``SYNCS`` in all (read by the manager's
map records), ``READS`` by what was read. There are no capacities to
overflow: the tables have twice as many slots as keys. On an error the CPU
builder is run on the same input to raise its exact message.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import mlx.core as mx

from ... import _ext
from ..base import symmetric_onto_itself
from . import jit

# Key packing and the table hash are metal/lattice_keys.h (shared with the
# C++ builder and the Metal kernels), prepended to every source below.
COMMON = _ext.lattice_keys_source() + """
using namespace mlx_lattice;

// Slots hold key + 1 so that a zero-filled table is empty.
__device__ inline int lattice_find(
    const unsigned long long* keys, const int* vals, unsigned long long mask,
    unsigned long long key) {
  if (key == kEmptyKey) return -1;
  unsigned long long h = key_hash(key) & mask;
  for (;;) {
    const unsigned long long s = keys[h];
    if (s == key + 1ull) return vals[h];
    if (s == 0ull) return -1;
    h = (h + 1ull) & mask;
  }
}

// Candidate of axis value c through kernel tap d: the conv form
// s*c - p + dil*d, or the transposed form (c + p - dil*d) / s when divisible.
// Returns 0 (invalid), 1 (valid, *v set) or 2 (an integer outside the range).
__device__ inline int lattice_axis(
    long long c, int d, int s, int p, int dil, bool transposed, long long* v) {
  long long t;
  if (!transposed) {
    t = (long long)s * c - p + (long long)dil * d;
  } else {
    long long u = c + p - (long long)dil * d;
    long long r = u % s;
    if (r < 0) r += s;
    if (r != 0) return 0;
    t = u / s;
  }
  *v = t;
  return coord_in_range(t) ? 1 : 2;
}

// Packed key of row q through offset k (dx outer, dz inner), kEmptyKey when a
// candidate is invalid; *overflow set when one lies outside the range.
__device__ inline unsigned long long lattice_key(
    const int* q, int k, const int* spec, bool transposed, bool* overflow) {
  const int kz = spec[2], ky = spec[1];
  const int d[3] = {k / (ky * kz), (k / kz) % ky, k % kz};
  unsigned long long key = key_batch(q[0]);
  bool valid = true;
  for (int a = 0; a < 3; ++a) {
    long long v = 0;
    const int st = lattice_axis(q[a + 1], d[a], spec[3 + a], spec[6 + a], spec[9 + a], transposed, &v);
    if (st == 2) *overflow = true;
    if (st != 1) {
      valid = false;
    } else {
      key += key_axis(a, v);
    }
  }
  return valid ? key : kEmptyKey;
}

// Candidate idx of a support: (row, offset) over every offset of every row,
// or with ONE (kernel size == stride, dilation 1, not generative: each row
// reaches exactly one output) one per row, through the offset its
// coordinates select, d = (c + p) mod s per axis. *q is set to the row.
template <bool ONE>
__device__ inline int support_candidate(long idx, int kv, const int* coords, const int* spec, const int** q) {
  if (!ONE) {
    *q = coords + 4 * (idx / kv);
    return (int)(idx % kv);
  }
  *q = coords + 4 * idx;
  int k = 0;
  for (int a = 0; a < 3; ++a) {
    long long r = ((long long)(*q)[a + 1] + spec[6 + a]) % spec[3 + a];
    if (r < 0) r += spec[3 + a];
    k = k * spec[a] + (int)r;
  }
  return k;
}
"""

# One thread per row: insert key + 1 with atomicCAS; flags[0] on a row
# outside the range, flags[1] on a duplicate.
INSERT_SOURCE = """
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int n = params[0];
  if (i >= n) return;
  const unsigned long long mask = (unsigned long long)params[1];
  const int* r = coords + 4 * i;
  if (!in_range(r[0], r[1], r[2], r[3])) { atomicExch(&flags[0], 1); return; }
  const unsigned long long key = pack_key(r[0], r[1], r[2], r[3]);
  unsigned long long* ks = reinterpret_cast<unsigned long long*>(keys);
  unsigned long long h = key_hash(key) & mask;
  for (;;) {
    const unsigned long long prev = atomicCAS(ks + h, 0ull, key + 1ull);
    if (prev == 0ull) { vals[h] = (int)i; return; }
    if (prev == key + 1ull) { atomicExch(&flags[1], 1); return; }
    h = (h + 1ull) & mask;
  }
"""

# One thread per (output row, offset): the dense neighbour map. Output rows
# outside the batch range reach nothing (as on the CPU).
LOOKUP_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int m = params[0];
  const int kv = params[1];
  if (idx >= (long)m * kv) return;
  const int r = (int)(idx / kv);
  const int k = (int)(idx % kv);
  const int* q = out_coords + 4 * (long)r;
  int found = -1;
  if (batch_in_range(q[0])) {
    bool overflow = false;
    const unsigned long long key = lattice_key(q, k, params + 3, TRANSPOSED, &overflow);
    found = lattice_find(
        reinterpret_cast<const unsigned long long*>(keys), vals,
        (unsigned long long)params[2], key);
  }
  nmap[idx] = found;
"""

# Symmetric relations (a centred odd kernel at stride 1 onto the same set):
# look up the first half of the offsets and mirror each hit; distinct
# threads write distinct slots. nmap starts at -1.
SYMMETRIC_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int n = params[0];
  const int kv = params[1];
  const int center = kv / 2;
  if (idx >= (long)n * (center + 1)) return;
  const int q = (int)(idx / (center + 1));
  const int k = (int)(idx % (center + 1));
  if (k == center) { nmap[(long)q * kv + center] = q; return; }
  bool overflow = false;
  const unsigned long long key = lattice_key(coords + 4 * (long)q, k, params + 3, false, &overflow);
  const int p = lattice_find(
      reinterpret_cast<const unsigned long long*>(keys), vals,
      (unsigned long long)params[2], key);
  if (p >= 0) {
    nmap[(long)q * kv + k] = p;
    nmap[(long)p * kv + (kv - 1 - k)] = q;
  }
"""

# One thread per row of a neighbour map (M, K): its hit count at counts[r + 1]
# (counts[0] stays 0, so that the cumulative sum is the CSR offsets); where
# params[2], its neighbour bitmask and the sorted plan's first key (the low
# 32 mask bits above the row index); and, reduced per warp into stats, the
# edge count [0], the most edges of a row [1] and, where DEGREE, the most
# edges of an input row [2], from deg's integer atomics (neither the counts
# nor their maximum depend on scheduling). No thread returns before the
# warp's shuffles.
ROWS_SOURCE = """
  const long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int m = params[0];
  const int kv = params[1];
  const bool bits = params[2] != 0;
  int count = 0, most_in = 0;
  if (r < m) {
    unsigned long long mask = 0ull;
    for (int k = 0; k < kv; ++k) {
      const int p = nmap[r * kv + k];
      if (p < 0) continue;
      ++count;
      if (bits) mask |= 1ull << k;
      if (DEGREE) most_in = max(most_in, atomicAdd(&deg[p], 1) + 1);
    }
    counts[r + 1] = count;
    if (bits) {
      reinterpret_cast<unsigned long long*>(masks)[r] = mask;
      reinterpret_cast<unsigned long long*>(key)[r] = ((mask & 0xffffffffull) << 32) | (unsigned long long)r;
    }
  }
  int total = count, most = count;
  for (int o = 16; o > 0; o >>= 1) {
    total += __shfl_xor_sync(0xffffffffu, total, o);
    most = max(most, __shfl_xor_sync(0xffffffffu, most, o));
    most_in = max(most_in, __shfl_xor_sync(0xffffffffu, most_in, o));
  }
  if ((threadIdx.x & 31) == 0 && total > 0) {
    atomicAdd(&stats[0], total);
    atomicMax(&stats[1], most);
    if (DEGREE) atomicMax(&stats[2], most_in);
  }
"""

# One thread per output row: the row's hits in offset order at its offset.
COMPACT_SOURCE = """
  const long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int m = params[0];
  const int kv = params[1];
  if (r >= m) return;
  int j = offsets[r];
  for (int k = 0; k < kv; ++k) {
    const int p = nmap[r * kv + k];
    if (p >= 0) {
      in_idx[j] = p;
      k_idx[j] = k;
      ++j;
    }
  }
"""

# One thread per (input row, offset): the packed output reached (kEmptyKey when
# none); flags[0] when one lies outside the range.
CANDIDATES_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int n = params[0];
  const int kv = params[1];
  if (idx >= (long)n * (ONE ? 1 : kv)) return;
  bool overflow = false;
  const int* q;
  const int k = support_candidate<ONE>(idx, kv, coords, params + 3, &q);
  const unsigned long long key = lattice_key(q, k, params + 3, TRANSPOSED, &overflow);
  if (overflow) atomicExch(&flags[0], 1);
  reinterpret_cast<unsigned long long*>(cand)[idx] = key;
"""

# One thread per sorted candidate: first of its run (and not empty).
FIRST_SOURCE = """
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int n = params[0];
  if (i >= n) return;
  const unsigned long long* s = reinterpret_cast<const unsigned long long*>(sorted);
  first[i] = (s[i] != kEmptyKey && (i == 0 || s[i] != s[i - 1])) ? 1 : 0;
"""

# One thread per sorted candidate: unpack the firsts at their rank.
UNPACK_SOURCE = """
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int n = params[0];
  if (i >= n) return;
  const unsigned long long* s = reinterpret_cast<const unsigned long long*>(sorted);
  if (!(s[i] != kEmptyKey && (i == 0 || s[i] != s[i - 1]))) return;
  const unsigned long long k = s[i];
  int* o = out + 4 * (long)(rank[i] - 1);
  o[0] = unpack_batch(k);
  for (int a = 0; a < 3; ++a) o[1 + a] = unpack_axis(k, a);
"""


# Supports by hashing: one thread per (input row, offset) inserts the output
# key it reaches into a table of twice as many slots as candidates; the
# insert that claims a key's slot marks its candidate the key's winner;
# flags[0] when a candidate lies outside the range.
SUPPORT_INSERT_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int n = params[0];
  const int kv = params[1];
  if (idx >= (long)n * (ONE ? 1 : kv)) return;
  const unsigned long long mask = (unsigned long long)(unsigned int)params[2];
  bool overflow = false;
  const int* q;
  const int k = support_candidate<ONE>(idx, kv, coords, params + 3, &q);
  const unsigned long long key = lattice_key(q, k, params + 3, TRANSPOSED, &overflow);
  if (overflow) atomicExch(&flags[0], 1);
  int won = 0;
  if (key != kEmptyKey) {
    unsigned long long* ks = reinterpret_cast<unsigned long long*>(keys);
    unsigned long long h = key_hash(key) & mask;
    for (;;) {
      const unsigned long long prev = atomicCAS(ks + h, 0ull, key + 1ull);
      if (prev == 0ull) { won = 1; break; }
      if (prev == key + 1ull) break;
      h = (h + 1ull) & mask;
    }
  }
  winner[idx] = won;
"""

# One thread per candidate: each winner writes its key at its rank (the
# winners' order depends on scheduling; the sort after it does not).
SUPPORT_COMPACT_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int n = params[0];
  const int kv = params[1];
  if (idx >= (long)n * (ONE ? 1 : kv) || winner[idx] == 0) return;
  bool overflow = false;
  const int* q;
  const int k = support_candidate<ONE>(idx, kv, coords, params + 3, &q);
  reinterpret_cast<unsigned long long*>(uniq)[rank[idx] - 1] = lattice_key(q, k, params + 3, TRANSPOSED, &overflow);
"""

# One thread per sorted unique key: its coordinates.
UNPACK_UNIQUE_SOURCE = """
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= params[0]) return;
  const unsigned long long k = reinterpret_cast<const unsigned long long*>(sorted)[i];
  int* o = out + 4 * i;
  o[0] = unpack_batch(k);
  for (int a = 0; a < 3; ++a) o[1 + a] = unpack_axis(k, a);
"""


# On the GPU stream whatever the default: a set hashed on the GPU keeps
# building its maps there when a later call runs under mx.stream(mx.cpu).
_kernel = jit.Family("mlx_lattice_map_", {
    "insert": (["coords", "params"], ["keys", "vals", "flags"], INSERT_SOURCE),
    "lookup": (["keys", "vals", "out_coords", "params"], ["nmap"], LOOKUP_SOURCE),
    "symmetric": (["keys", "vals", "coords", "params"], ["nmap"], SYMMETRIC_SOURCE),
    "rows": (["nmap", "params"], ["counts", "stats", "masks", "key", "deg"], ROWS_SOURCE),
    "compact": (["nmap", "offsets", "params"], ["in_idx", "k_idx"], COMPACT_SOURCE),
    "candidates": (["coords", "params"], ["cand", "flags"], CANDIDATES_SOURCE),
    "first": (["sorted", "params"], ["first"], FIRST_SOURCE),
    "unpack": (["sorted", "rank", "params"], ["out"], UNPACK_SOURCE),
    "support_insert": (["coords", "params"], ["keys", "winner", "flags"], SUPPORT_INSERT_SOURCE),
    "support_compact": (["coords", "winner", "rank", "params"], ["uniq"], SUPPORT_COMPACT_SOURCE),
    "unpack_unique": (["sorted", "params"], ["out"], UNPACK_UNIQUE_SOURCE),
}, header=COMMON, stream=mx.gpu)
_launch = _kernel.launch


SYNCS = 0  # host synchronisations of map building so far (read by the manager's records)
READS: Counter = Counter()  # the same, by what was read (tests, the step profile)


def _read(what: str, *arrays) -> list[int]:
    """Evaluate small integer arrays and read them on the host: one
    synchronisation, counted in SYNCS and in READS under `what`. Callers
    pass slices (``a[-1:]``), not integer indices: MLX makes ``a[-1]`` a
    gather, a kernel it compiles at run time."""
    global SYNCS
    SYNCS += 1
    READS[what] += 1
    if len(arrays) == 1 and arrays[0].ndim == 1 and arrays[0].dtype == mx.int32:
        return np.array(arrays[0]).tolist()
    flat = mx.concatenate([mx.reshape(a, (-1,)).astype(mx.int32) for a in arrays])  # int32: no casts
    return np.array(flat).tolist()


def _geometry_params(kernel_size, stride, padding, dilation):
    return [*kernel_size, *stride, *padding, *dilation]


class CudaTable:
    """Open-addressing table on the GPU from packed coordinates to rows:
    2 * max(N, 8) slots rounded up to a power of two (as on the CPU).

    ``trusted``: the rows are unique and in range by construction (an output
    support built here), so the error flags are not read back."""

    def __init__(self, coords: mx.array, trusted: bool = False):
        if coords.ndim != 2 or coords.shape[1] != 4 or coords.dtype != mx.int32:
            raise ValueError("coords must be an (N, 4) int32 array")
        self.coords = coords
        self.size = n = coords.shape[0]
        cap = 16
        while cap < 2 * max(n, 8):
            cap *= 2
        if cap > 2**31:
            raise ValueError(f"coords has {n} rows; the GPU table holds at most 2**30")
        self.mask = cap - 1
        keys, vals, flags = _launch(
            "insert", n, [coords, jit.params(n, self.mask)],
            [(cap,), (cap,), (2,)], [mx.uint64, mx.int32, mx.int32], init_value=0,
        )
        if n and not trusted and any(_read("table flags", flags)):  # a set's one synchronisation
            _ext.CoordTable(coords)  # raises the CPU builder's message
            raise AssertionError("GPU table flagged coordinates the CPU table accepts")
        self.keys, self.vals = keys, vals


# How output supports deduplicate their N * K candidate keys by default (a
# support's ``dedup=`` chooses per call): "hash" (insert them into a table,
# compact the winners, sort the M unique keys) or "sort" (sort all N * K,
# keep the first of each run).
SUPPORT_DEDUP = "hash"


def _support_error(table: CudaTable, geometry, generative: bool):
    fn = _ext.generative_support if generative else _ext.forward_support
    fn(_ext.CoordTable(table.coords), *geometry)  # raises the CPU builder's message
    raise AssertionError("GPU support flagged a range error the CPU builder accepts")


def _one_per_row(geometry, generative: bool) -> bool:
    """Whether each input row reaches exactly one output of the support: a
    strided (not generative) layer whose kernel tiles the grid (kernel size ==
    stride, dilation 1), as a U-Net's k2s2 downsampling. Its supports then
    have N candidates, not N * K."""
    kernel_size, stride, _, dilation = geometry
    return not generative and tuple(kernel_size) == tuple(stride) and all(d == 1 for d in dilation)


def _support_template(geometry, generative: bool):
    return [("TRANSPOSED", not generative), ("ONE", _one_per_row(geometry, generative))]


def _support(table: CudaTable, geometry, generative: bool, dedup: str | None = None) -> mx.array:
    dedup = SUPPORT_DEDUP if dedup is None else dedup
    if dedup not in ("hash", "sort"):
        raise ValueError(f"dedup must be 'hash' or 'sort', got {dedup!r}")
    n, kv = table.size, int(np.prod(geometry[0]))
    if n == 0:
        return mx.zeros((0, 4), mx.int32)
    if dedup == "hash":
        return _support_by_hash(table, geometry, generative)
    params = jit.params(n, kv, 0, *_geometry_params(*geometry))
    total = n if _one_per_row(geometry, generative) else n * kv
    cand, flags = _launch(
        "candidates", total, [table.coords, params], [(total,), (1,)], [mx.uint64, mx.int32],
        template=_support_template(geometry, generative), init_value=0,
    )
    srt = mx.sort(cand)
    first = _launch("first", total, [srt, jit.params(total)], [(total,)], [mx.int32])[0]
    rank = mx.cumsum(first)
    m, bad = _read("support size", rank[-1:], flags)  # the one synchronisation of a support
    if bad:
        _support_error(table, geometry, generative)
    if m == 0:
        return mx.zeros((0, 4), mx.int32)
    return _launch("unpack", total, [srt, rank, jit.params(total)], [(m, 4)], [mx.int32])[0]


def _support_by_hash(table: CudaTable, geometry, generative: bool) -> mx.array:
    """The support through a table of the candidates: only the M unique keys
    are sorted (M is read in the support's one synchronisation)."""
    n, kv = table.size, int(np.prod(geometry[0]))
    total = n if _one_per_row(geometry, generative) else n * kv
    cap = 16
    while cap < 2 * total:
        cap *= 2
    if cap > 2**31:
        raise ValueError(f"{n} rows times a kernel volume of {kv} is more than 2**30 candidate outputs")
    params = jit.params(n, kv, cap - 1, *_geometry_params(*geometry))
    tmpl = _support_template(geometry, generative)
    _, winner, flags = _launch(
        "support_insert", total, [table.coords, params], [(cap,), (total,), (1,)],
        [mx.uint64, mx.int32, mx.int32], template=tmpl, init_value=0,
    )
    rank = mx.cumsum(winner)
    m, bad = _read("support size", rank[-1:], flags)  # the one synchronisation of a support
    if bad:
        _support_error(table, geometry, generative)
    if m == 0:
        return mx.zeros((0, 4), mx.int32)
    uniq = _launch("support_compact", total, [table.coords, winner, rank, params], [(m,)], [mx.uint64],
                   template=tmpl)[0]
    return _launch("unpack_unique", m, [mx.sort(uniq), jit.params(m)], [(m, 4)], [mx.int32])[0]


def forward_support(table: CudaTable, geometry, dedup: str | None = None) -> mx.array:
    """Every output a strided convolution reaches, sorted by packed key;
    ``dedup``: how the candidates are deduplicated (default SUPPORT_DEDUP)."""
    return _support(table, geometry, False, dedup)


def generative_support(table: CudaTable, geometry, dedup: str | None = None) -> mx.array:
    """Every output a generative transposed convolution reaches, sorted;
    ``dedup`` as for :func:`forward_support`."""
    return _support(table, geometry, True, dedup)


def row_summary(nmap: mx.array, n_in: int | None = None):
    """(counts (M + 1), stats (4,), (masks, key) or None) of a neighbour map
    (M, K), one kernel: see ROWS_SOURCE. ``n_in``: count the input rows' edges
    too (stats[2]); masks and keys where K <= 64."""
    m, kv = nmap.shape
    bits = kv <= 64
    degree = bool(n_in)
    counts, stats, masks, key, _ = _launch(
        "rows", m, [nmap, jit.params(m, kv, bits)],
        [(m + 1,), (4,), (m if bits else 1,), (m if bits else 1,), (n_in if degree else 1,)],
        [mx.int32, mx.int32, mx.uint64, mx.uint64, mx.int32], template=[("DEGREE", degree)], init_value=0,
    )
    return counts, stats, ((masks, key) if bits else None)


def build_relation(table: CudaTable, out_coords: mx.array, geometry, transposed: bool, kind: str):
    """The native relation of ``_ext.build_relation``, built on the GPU."""
    return build(table, out_coords, geometry, transposed, kind)[0]


def build(table: CudaTable, out_coords: mx.array, geometry, transposed: bool, kind: str,
          onto_support: bool = False):
    """(the native relation, the most edges of an output row, the most edges
    of an input row, its rows' (masks, sort keys) or None), built on the
    GPU in four kernels and one synchronisation (route ``cuda.hash_map``):
    the neighbour map, its row summary (counts, sizes, masks), the offsets'
    cumulative sum and the compaction. A symmetric relation (a centred odd
    kernel at stride 1 onto the table's own rows, so that edge (q, p, k)
    exists exactly when (p, q, K - 1 - k) does) looks up half the offsets
    and is marked so (``symmetric``).
    ``onto_support``: ``out_coords`` is the table's own forward support under
    ``geometry``. Where that kernel tiles the grid (k2s2), every input row
    has exactly one edge, so the size is known without a synchronisation
    (the largest output row is then left unread: None)."""
    for k in geometry[0]:
        if k > 64:
            raise ValueError("kernel sizes above 64 are not supported")
    if out_coords.ndim != 2 or out_coords.shape[1] != 4 or out_coords.dtype != mx.int32:
        raise ValueError("output coordinates must be an (N, 4) int32 array")
    m, kv = out_coords.shape[0], int(np.prod(geometry[0]))
    gp = _geometry_params(*geometry)
    symmetric = symmetric_onto_itself(table, out_coords, geometry, transposed)
    # one edge per input row: a tiling kernel onto the support it made
    tiled = onto_support and not transposed and _one_per_row(geometry, False)
    if m == 0:
        nmap = mx.zeros((0, kv), mx.int32)
    elif symmetric:
        nmap = _launch(
            "symmetric", m * (kv // 2 + 1),
            [table.keys, table.vals, table.coords, jit.params(m, kv, table.mask, *gp)],
            [(m, kv)], [mx.int32], init_value=-1,
        )[0]
    else:
        nmap = _launch(
            "lookup", m * kv,
            [table.keys, table.vals, mx.contiguous(out_coords), jit.params(m, kv, table.mask, *gp)],
            [(m, kv)], [mx.int32], template=[("TRANSPOSED", transposed)],
        )[0]
    if m == 0:
        offsets, rows = mx.zeros((1,), mx.int32), None
        edges = max_out = max_in = 0
    else:
        degree = not symmetric and not tiled and table.size > 0
        counts, stats, rows = row_summary(nmap, table.size if degree else None)
        if tiled:
            edges, max_out, max_in = table.size, None, 1
        else:
            # The one synchronisation of a relation: its edge count and largest rows.
            edges, max_out, max_in = _read("relation size", stats)[:3]
            if not degree:
                max_in = max_out  # symmetric: as many edges per input row as per output row
        offsets = mx.cumsum(counts)
    if edges:
        in_idx, k_idx = _launch(
            "compact", m, [nmap, offsets, jit.params(m, kv)], [(edges,), (edges,)], [mx.int32, mx.int32]
        )
    else:
        in_idx = k_idx = mx.zeros((0,), mx.int32)
    # Left lazy (no second synchronisation): the GPU routes take them as
    # inputs; a host read through the native relation (tests) evaluates
    # them first.
    native = _ext.Relation(kind, table.size, m, kv, offsets, in_idx, k_idx)
    native.set_neighbor_map(nmap)
    if symmetric:
        native.set_symmetric()
    return native, max_out, max_in, rows
