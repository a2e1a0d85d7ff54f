// Map building on the GPU: the coordinate hash table and the output-major
// relation (CSR in offset order), equal element for element to the CPU
// builder (src/core/kernel_map.cpp). Buffer bindings and dispatch shapes: the
// programs in src/metal/map_build.cpp.
//
// The table holds row indices, not keys: a slot is claimed with a 32-bit
// compare-and-swap of -1 to the row, and keys are compared through the
// rows' coordinates. No 64-bit atomics are needed, and the relation does
// not depend on which row won a slot (each key has one row). Two words past
// the slots hold the smallest duplicate row and the smallest row outside
// the coordinate range (INT_MAX: none), read back at the map's one sync.
#include <metal_stdlib>

// The coordinate range, key packing and the CPU table's hash (z-runs of 4
// share neighbouring slots, the rest of the key is mixed).
#include "lattice_keys.h"
#include "params.h"

using namespace metal;
using namespace mlx_lattice;

constant int kNone = 0x7fffffff;

// Slots to -1, the two flag words to kNone.
[[kernel]] void map_table_clear(
    device int* table [[buffer(0)]],
    constant MapParams& p [[buffer(1)]],
    uint tid [[thread_position_in_grid]]) {
  const long slots = long(p.mask) + 1;
  if (long(tid) < slots) {
    table[tid] = -1;
  } else if (long(tid) < slots + 2) {
    table[tid] = kNone;
  }
}

// One thread per input row: claim the first free slot of its probe run.
[[kernel]] void map_table_insert(
    device const int* coords [[buffer(0)]],
    device atomic_int* table [[buffer(1)]],
    constant MapParams& p [[buffer(2)]],
    uint tid [[thread_position_in_grid]]) {
  const int i = int(tid);
  if (i >= p.n_in) {
    return;
  }
  device atomic_int* flags = table + long(p.mask) + 1;
  device const int* c = coords + 4 * long(i);
  if (!in_range(c[0], c[1], c[2], c[3])) {
    atomic_fetch_min_explicit(flags + 1, i, memory_order_relaxed);
    return;
  }
  ulong h = key_hash(pack_key(c[0], c[1], c[2], c[3])) & ulong(p.mask);
  // At most n_in of the >= 2 n_in slots are ever taken: a free one is
  // reached. Only advancing counts as a probe: a spurious failure of the
  // weak exchange (expected still -1) retries the same slot.
  for (int probe = 0; probe <= p.mask;) {
    int expected = -1;
    if (atomic_compare_exchange_weak_explicit(
            table + h, &expected, i, memory_order_relaxed, memory_order_relaxed)) {
      return;
    }
    if (expected >= 0) {
      device const int* o = coords + 4 * long(expected);
      if (o[0] == c[0] && o[1] == c[1] && o[2] == c[2] && o[3] == c[3]) {
        atomic_fetch_min_explicit(flags, max(i, expected), memory_order_relaxed);
        return;
      }
      h = (h + 1) & ulong(p.mask);
      ++probe;
    }
  }
}

// The input row at (b, x, y, z), or -1.
inline int map_find(
    device const int* coords,
    device const int* table,
    int mask,
    int b,
    long x,
    long y,
    long z) {
  ulong h = key_hash(pack_key(b, x, y, z)) & ulong(mask);
  for (int probe = 0; probe <= mask; ++probe) {
    const int r = table[h];
    if (r < 0) {
      return -1;
    }
    device const int* o = coords + 4 * long(r);
    if (o[0] == b && o[1] == x && o[2] == y && o[3] == z) {
      return r;
    }
    h = (h + 1) & ulong(mask);
  }
  return -1;
}

// Candidate of coordinate q along axis a for kernel index d: 0 where there
// is none (not divisible), 1 with v set, 2 for an integer outside the range.
inline int map_axis_value(constant MapParams& p, int a, long q, int d, thread long& v) {
  if (p.transposed) {
    const long t = q + p.padding[a] - long(p.dilation[a]) * d;
    const long s = p.stride[a];
    if (((t % s) + s) % s != 0) {
      return 0;
    }
    v = t / s;
  } else {
    v = long(p.stride[a]) * q - p.padding[a] + long(p.dilation[a]) * d;
  }
  return coord_in_range(v) ? 1 : 2;
}

// Candidate coordinate of output coordinate q along axis a for kernel index
// d; false where there is none (not divisible, or outside the range).
inline bool map_axis(constant MapParams& p, int a, long q, int d, thread long& v) {
  return map_axis_value(p, a, q, d, v) == 1;
}

// Kernel index k in weight order (dx outer, dz inner) per axis.
inline void map_taps(constant MapParams& p, int k, thread int* d) {
  d[0] = k / (p.size[1] * p.size[2]);
  d[1] = (k / p.size[2]) % p.size[1];
  d[2] = k % p.size[2];
}

// The input row reached by output row r through offset k (weight order:
// dx outer, dz inner), or -1.
inline int map_neighbor(
    device const int* in_coords,
    device const int* table,
    device const int* out_coords,
    constant MapParams& p,
    int r,
    int k) {
  device const int* q = out_coords + 4 * long(r);
  if (!batch_in_range(q[0])) {
    return -1;
  }
  int d[3];
  map_taps(p, k, d);
  long v[3];
  for (int a = 0; a < 3; ++a) {
    if (!map_axis(p, a, q[a + 1], d[a], v[a])) {
      return -1;
    }
  }
  return map_find(in_coords, table, p.mask, q[0], v[0], v[1], v[2]);
}

// Count step: offsets[r + 1] = edges of output row r; offsets[0] = 0.
[[kernel]] void map_count(
    device const int* in_coords [[buffer(0)]],
    device const int* table [[buffer(1)]],
    device const int* out_coords [[buffer(2)]],
    device int* offsets [[buffer(3)]],
    constant MapParams& p [[buffer(4)]],
    uint tid [[thread_position_in_grid]]) {
  const int r = int(tid);
  if (r == 0) {
    offsets[0] = 0;
  }
  if (r >= p.n_out) {
    return;
  }
  int count = 0;
  for (int k = 0; k < p.kv; ++k) {
    count += map_neighbor(in_coords, table, out_coords, p, r, k) >= 0;
  }
  offsets[r + 1] = count;
}

// Inclusive scan of offsets[1..n_out] in place, by one threadgroup of
// MAP_SCAN_THREADS: each thread sums a contiguous chunk, the chunk sums are
// scanned in shared memory, then each chunk is rewritten from its base.
[[kernel]] void map_scan(
    device int* offsets [[buffer(0)]],
    constant MapParams& p [[buffer(1)]],
    uint t [[thread_index_in_threadgroup]]) {
  threadgroup int sums[MAP_SCAN_THREADS];
  const int per = (p.n_out + MAP_SCAN_THREADS - 1) / MAP_SCAN_THREADS;
  const int b = 1 + int(t) * per;
  const int e = min(b + per, p.n_out + 1);
  int s = 0;
  for (int i = b; i < e; ++i) {
    s += offsets[i];
  }
  sums[t] = s;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int step = 1; step < MAP_SCAN_THREADS; step <<= 1) {
    const int add = int(t) >= step ? sums[t - step] : 0;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    sums[t] += add;
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  int run = sums[t] - s;
  for (int i = b; i < e; ++i) {
    run += offsets[i];
    offsets[i] = run;
  }
}

// Fill step: edges (2, E): row 0 the input rows, row 1 the offsets, of
// every output row in offset order from offsets[r].
[[kernel]] void map_fill(
    device const int* in_coords [[buffer(0)]],
    device const int* table [[buffer(1)]],
    device const int* out_coords [[buffer(2)]],
    device const int* offsets [[buffer(3)]],
    device int* edges [[buffer(4)]],
    constant MapParams& p [[buffer(5)]],
    uint tid [[thread_position_in_grid]]) {
  const int r = int(tid);
  if (r >= p.n_out) {
    return;
  }
  int j = offsets[r];
  for (int k = 0; k < p.kv; ++k) {
    const int i = map_neighbor(in_coords, table, out_coords, p, r, k);
    if (i >= 0) {
      edges[j] = i;
      edges[long(p.edges) + j] = k;
      ++j;
    }
  }
}

// ------------------------------------------------------------------ views
// The views follow src/core/relation.cpp: the neighbour map (n_out, K) of input
// rows, and the kernel-major view (edges stably sorted by offset), built
// column by column from the edge map (n_out, K) of CSR edge indices.

// Per output row: the edge map's row (edge index or -1); with `rows_of_in`
// the input rows instead (the neighbour map).
inline void map_row_scatter(
    device const int* offsets,
    device const int* in_idx,
    device const int* k_idx,
    device int* dst,
    constant MapParams& p,
    int r,
    bool rows_of_in) {
  device int* row = dst + long(r) * p.kv;
  for (int k = 0; k < p.kv; ++k) {
    row[k] = -1;
  }
  for (int j = offsets[r]; j < offsets[r + 1]; ++j) {
    row[k_idx[j]] = rows_of_in ? in_idx[j] : j;
  }
}

[[kernel]] void map_neighbor_map(
    device const int* offsets [[buffer(0)]],
    device const int* in_idx [[buffer(1)]],
    device const int* k_idx [[buffer(2)]],
    device int* nmap [[buffer(3)]],
    constant MapParams& p [[buffer(4)]],
    uint tid [[thread_position_in_grid]]) {
  if (int(tid) < p.n_out) {
    map_row_scatter(offsets, in_idx, k_idx, nmap, p, int(tid), true);
  }
}

// One thread per output row: the row of each of its edges (out_idx).
[[kernel]] void map_out_idx(
    device const int* offsets [[buffer(0)]],
    device int* out_idx [[buffer(1)]],
    constant MapParams& p [[buffer(2)]],
    uint tid [[thread_position_in_grid]]) {
  const int r = int(tid);
  if (r >= p.n_out) {
    return;
  }
  for (int j = offsets[r]; j < offsets[r + 1]; ++j) {
    out_idx[j] = r;
  }
}

[[kernel]] void map_edge_map(
    device const int* offsets [[buffer(0)]],
    device const int* in_idx [[buffer(1)]],
    device const int* k_idx [[buffer(2)]],
    device int* emap [[buffer(3)]],
    constant MapParams& p [[buffer(4)]],
    uint tid [[thread_position_in_grid]]) {
  if (int(tid) < p.n_out) {
    map_row_scatter(offsets, in_idx, k_idx, emap, p, int(tid), false);
  }
}

// Column k of the edge map (one threadgroup of MAP_SCAN_THREADS per
// offset), each thread over a contiguous chunk of rows. Counting pass:
// view[k + 1] = edges at offset k (view[0] = 0; map_scan makes offsets).
// Writing pass: the column's edges in row order at view[k] + their rank:
// perm (the CSR edge), then in and out, each E long after the K + 1
// offsets.
[[kernel]] void map_column_count(
    device const int* emap [[buffer(0)]],
    device int* view [[buffer(1)]],
    constant MapParams& p [[buffer(2)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint t [[thread_index_in_threadgroup]]) {
  threadgroup int sums[MAP_SCAN_THREADS];
  const int k = int(group.x);
  const int per = (p.n_out + MAP_SCAN_THREADS - 1) / MAP_SCAN_THREADS;
  const int b = int(t) * per;
  const int e = min(b + per, p.n_out);
  int s = 0;
  for (int r = b; r < e; ++r) {
    s += emap[long(r) * p.kv + k] >= 0;
  }
  sums[t] = s;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (t == 0) {
    int total = 0;
    for (int i = 0; i < MAP_SCAN_THREADS; ++i) {
      total += sums[i];
    }
    view[k + 1] = total;
    if (k == 0) {
      view[0] = 0;
    }
  }
}

[[kernel]] void map_column_fill(
    device const int* emap [[buffer(0)]],
    device const int* in_idx [[buffer(1)]],
    device int* view [[buffer(2)]],
    constant MapParams& p [[buffer(3)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint t [[thread_index_in_threadgroup]]) {
  threadgroup int sums[MAP_SCAN_THREADS];
  const int k = int(group.x);
  const int per = (p.n_out + MAP_SCAN_THREADS - 1) / MAP_SCAN_THREADS;
  const int b = int(t) * per;
  const int e = min(b + per, p.n_out);
  int s = 0;
  for (int r = b; r < e; ++r) {
    s += emap[long(r) * p.kv + k] >= 0;
  }
  sums[t] = s;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int step = 1; step < MAP_SCAN_THREADS; step <<= 1) {
    const int add = int(t) >= step ? sums[t - step] : 0;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    sums[t] += add;
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  const long edges = p.edges;
  device int* perm = view + p.kv + 1;
  long at = view[k] + sums[t] - s;
  for (int r = b; r < e; ++r) {
    const int j = emap[long(r) * p.kv + k];
    if (j >= 0) {
      perm[at] = j;
      perm[edges + at] = in_idx[j];
      perm[2 * edges + at] = r;
      ++at;
    }
  }
}

// Input-major view: edges stably sorted by input row of the kernel-major
// order, i.e. by (in, k). An (in, k) pair has at most one edge (the output
// row is determined by both, for unique output coordinates), so the view is
// built like the relation itself from an (n_in, K) map of edge indices.
// Per output row: its edges into the input edge map (cleared first), and
// each edge's output row.
[[kernel]] void map_input_edge_map(
    device const int* offsets [[buffer(0)]],
    device const int* in_idx [[buffer(1)]],
    device const int* k_idx [[buffer(2)]],
    device int* imap [[buffer(3)]],
    device int* edge_out [[buffer(4)]],
    constant MapParams& p [[buffer(5)]],
    uint tid [[thread_position_in_grid]]) {
  const int r = int(tid);
  if (r >= p.n_out) {
    return;
  }
  for (int j = offsets[r]; j < offsets[r + 1]; ++j) {
    imap[long(in_idx[j]) * p.kv + k_idx[j]] = j;
    edge_out[j] = r;
  }
}

[[kernel]] void map_fill_minus_one(
    device int* a [[buffer(0)]],
    constant MapParams& p [[buffer(1)]],
    uint tid [[thread_position_in_grid]]) {
  if (long(tid) < long(p.n_in) * p.kv) {
    a[tid] = -1;
  }
}

// view: offsets (n_in + 1), then perm, out and k rows, each E long.
[[kernel]] void map_input_count(
    device const int* imap [[buffer(0)]],
    device int* view [[buffer(1)]],
    constant MapParams& p [[buffer(2)]],
    uint tid [[thread_position_in_grid]]) {
  const int i = int(tid);
  if (i == 0) {
    view[0] = 0;
  }
  if (i >= p.n_in) {
    return;
  }
  int count = 0;
  for (int k = 0; k < p.kv; ++k) {
    count += imap[long(i) * p.kv + k] >= 0;
  }
  view[i + 1] = count;
}

[[kernel]] void map_input_fill(
    device const int* imap [[buffer(0)]],
    device const int* edge_out [[buffer(1)]],
    device const int* k_idx [[buffer(2)]],
    device int* view [[buffer(3)]],
    constant MapParams& p [[buffer(4)]],
    uint tid [[thread_position_in_grid]]) {
  const int i = int(tid);
  if (i >= p.n_in) {
    return;
  }
  const long edges = p.edges;
  device int* perm = view + p.n_in + 1;
  long at = view[i];
  for (int k = 0; k < p.kv; ++k) {
    const int j = imap[long(i) * p.kv + k];
    if (j >= 0) {
      perm[at] = j;
      perm[edges + at] = edge_out[j];
      perm[2 * edges + at] = k_idx[j];
      ++at;
    }
  }
}

// ------------------------------------------------------------------- sort
// A bitonic network over (key, value) elements, three int32 words each
// (key high, key low, value) from word s.base, ordered by key then value:
// one dispatch per pass, so no threadgroup waits on another; the passes of
// step j < MAP_SORT_BLOCK run together in shared memory. Values are
// distinct, so the order is a total one and the same under any schedule.

struct MapElem {
  ulong key;
  int value;
};

inline MapElem map_load(device const int* words, constant MapSortParams& s, long i) {
  device const int* w = words + long(s.base) + 3 * i;
  return MapElem{(ulong(uint(w[0])) << 32) | ulong(uint(w[1])), w[2]};
}

inline void map_store(device int* words, constant MapSortParams& s, long i, MapElem e) {
  device int* w = words + long(s.base) + 3 * i;
  w[0] = int(uint(e.key >> 32));
  w[1] = int(uint(e.key));
  w[2] = e.value;
}

// The compare-exchange of positions i and i + j at stage k (ascending where
// bit k of i is clear).
inline void map_order(thread MapElem& a, thread MapElem& b, long i, long k) {
  const bool greater = a.key > b.key || (a.key == b.key && a.value > b.value);
  if (greater == ((i & k) == 0)) {
    const MapElem t = a;
    a = b;
    b = t;
  }
}

// Pass (k, j >= MAP_SORT_BLOCK): one thread per pair.
[[kernel]] void map_sort_pass(
    device int* words [[buffer(0)]],
    constant MapSortParams& s [[buffer(1)]],
    uint tid [[thread_position_in_grid]]) {
  const long t = long(tid);
  const long j = s.j;
  if (t >= long(s.padded) / 2) {
    return;
  }
  const long i = 2 * j * (t / j) + t % j;
  MapElem a = map_load(words, s, i);
  MapElem b = map_load(words, s, i + j);
  map_order(a, b, i, s.k);
  map_store(words, s, i, a);
  map_store(words, s, i + j, b);
}

// One threadgroup of MAP_SORT_BLOCK / 2 threads per block of elements:
// with k = 0 every stage up to the block (the blocks sorted, alternately up
// and down), otherwise the passes j < MAP_SORT_BLOCK of stage k.
[[kernel]] void map_sort_block(
    device int* words [[buffer(0)]],
    constant MapSortParams& s [[buffer(1)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint t [[thread_index_in_threadgroup]]) {
  threadgroup ulong keys[MAP_SORT_BLOCK];
  threadgroup int values[MAP_SORT_BLOCK];
  const long first = long(group.x) * MAP_SORT_BLOCK;
  const int half = MAP_SORT_BLOCK / 2;
  for (int h = 0; h < 2; ++h) {
    const MapElem e = map_load(words, s, first + t + h * half);
    keys[t + h * half] = e.key;
    values[t + h * half] = e.value;
  }
  const int k_first = s.k == 0 ? 2 : s.k;
  const int k_last = s.k == 0 ? MAP_SORT_BLOCK : s.k;
  for (int k = k_first; k <= k_last; k <<= 1) {
    for (int j = min(k, int(MAP_SORT_BLOCK)) / 2; j > 0; j >>= 1) {
      threadgroup_barrier(mem_flags::mem_threadgroup);
      const int i = 2 * j * (int(t) / j) + int(t) % j;
      MapElem a = MapElem{keys[i], values[i]};
      MapElem b = MapElem{keys[i + j], values[i + j]};
      map_order(a, b, first + i, k);
      keys[i] = a.key;
      values[i] = a.value;
      keys[i + j] = b.key;
      values[i + j] = b.value;
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int h = 0; h < 2; ++h) {
    map_store(words, s, first + t + h * half, MapElem{keys[t + h * half], values[t + h * half]});
  }
}

// --------------------------------------------------------- output supports
// Forward and generative supports (src/core/kernel_map.cpp): every coordinate
// reached from the inputs, sorted by packed key and unique. One int32
// buffer holds the steps' state: scan offsets (count + 1), the error word,
// then the candidates from word count + 2 as sort elements (key, candidate
// index). Candidate idx is input row idx / K through offset idx % K. Keys
// that are not coordinates sort last: an integer candidate outside the
// range is kBadKey | row (the smallest bad row sorts first among them), a
// missing one or the padding kEmptyKey.

constant ulong kBadKey = 0x8000000000000000UL;

// One thread per padded candidate: its key (p.transposed: the forward form
// (c + p - dil*d) / s; otherwise the generative form s*c - p + dil*d).
[[kernel]] void map_support_keys(
    device const int* coords [[buffer(0)]],
    device int* words [[buffer(1)]],
    constant MapSortParams& s [[buffer(2)]],
    uint tid [[thread_position_in_grid]]) {
  constant MapParams& p = s.map;
  const long idx = long(tid);
  if (idx >= s.padded) {
    return;
  }
  ulong key = kEmptyKey;
  if (idx < s.count) {
    const int row = int(idx / p.kv);
    device const int* c = coords + 4 * long(row);
    int d[3];
    map_taps(p, int(idx % p.kv), d);
    key = key_batch(c[0]);
    bool valid = true;
    bool bad = false;
    for (int a = 0; a < 3; ++a) {
      long v = 0;
      const int state = map_axis_value(p, a, c[a + 1], d[a], v);
      valid = valid && state == 1;
      bad = bad || state == 2;
      if (state == 1) {
        key += key_axis(a, v);
      }
    }
    key = bad ? (kBadKey | ulong(row)) : (valid ? key : kEmptyKey);
  }
  map_store(words, s, idx, MapElem{key, int(idx)});
}

// Over the sorted keys (count + 1 threads): offsets[i + 1] = 1 where key i
// is a coordinate unlike key i - 1 (map_scan then makes the output rows),
// offsets[0] = 0; the thread at the first key that is not a coordinate
// writes the error word: the smallest input row reaching outside the range,
// or INT_MAX. The padding holds at least one kEmptyKey, so it exists.
[[kernel]] void map_support_flags(
    device int* words [[buffer(0)]],
    constant MapSortParams& s [[buffer(1)]],
    uint tid [[thread_position_in_grid]]) {
  const long i = long(tid);
  if (i > s.count) {
    return;
  }
  const ulong key = map_load(words, s, i).key;
  const ulong prev = i > 0 ? map_load(words, s, i - 1).key : kEmptyKey;
  if (i == 0) {
    words[0] = 0;
  }
  if (i < s.count) {
    words[i + 1] = key < kBadKey && (i == 0 || key != prev) ? 1 : 0;
  }
  if (key >= kBadKey && (i == 0 || prev < kBadKey)) {
    words[long(s.count) + 1] = key == kEmptyKey ? kNone : int(key & 0x7fffffffUL);
  }
}

// Fill: each first key of a run (count threads) decoded into its output
// row, out (n, 4) in key order.
[[kernel]] void map_support_fill(
    device const int* words [[buffer(0)]],
    device int* out [[buffer(1)]],
    constant MapSortParams& s [[buffer(2)]],
    uint tid [[thread_position_in_grid]]) {
  const long i = long(tid);
  if (i >= s.count || words[i + 1] == words[i]) {
    return;
  }
  const ulong key = map_load(words, s, i).key;
  device int* q = out + 4 * long(words[i]);
  q[0] = unpack_batch(key);
  for (int a = 0; a < 3; ++a) {
    q[a + 1] = unpack_axis(key, a);
  }
}

// ------------------------------------------------------------ sorted plan
// The sorted plan (src/core/relation.cpp): output rows stably sorted by their
// neighbour bitmask (bit k: an input through offset k; K <= 64), as sort
// elements (mask, row) in a temporary; padding (~0, n_out + i) sorts last.
// The plan buffer: the OR of each tile's masks first (MAP_PLAN_TILE rows;
// two words each, low first: uint64 little-endian, 8-byte aligned at the
// buffer's start, so the host views them as uint64 in place), then reorder
// rows (n_out), the neighbour map in sorted order (n_out, K) and its
// transpose (K, n_out).

inline ulong map_row_mask(device const int* nmap, int kv, long r) {
  ulong m = 0;
  for (int k = 0; k < kv; ++k) {
    m |= ulong(nmap[r * kv + k] >= 0) << k;
  }
  return m;
}

[[kernel]] void map_plan_keys(
    device const int* nmap [[buffer(0)]],
    device int* words [[buffer(1)]],
    constant MapSortParams& s [[buffer(2)]],
    uint tid [[thread_position_in_grid]]) {
  const long r = long(tid);
  if (r >= s.padded) {
    return;
  }
  const ulong key = r < s.count ? map_row_mask(nmap, s.map.kv, r) : kEmptyKey;
  map_store(words, s, r, MapElem{key, int(r)});
}

// One thread per sorted position: its row and neighbour map row in both
// layouts.
[[kernel]] void map_plan_rows(
    device const int* nmap [[buffer(0)]],
    device const int* words [[buffer(1)]],
    device int* plan [[buffer(2)]],
    constant MapSortParams& s [[buffer(3)]],
    uint tid [[thread_position_in_grid]]) {
  const long i = long(tid);
  if (i >= s.count) {
    return;
  }
  const long n = s.count;
  const int kv = s.map.kv;
  const int r = map_load(words, s, i).value;
  device int* rows = plan + 2 * ((n + MAP_PLAN_TILE - 1) / MAP_PLAN_TILE);
  rows[i] = r;
  for (int k = 0; k < kv; ++k) {
    const int v = nmap[long(r) * kv + k];
    rows[n + i * kv + k] = v;
    rows[n + n * kv + long(k) * n + i] = v;
  }
}

// One thread per tile: the OR of its rows' masks.
[[kernel]] void map_plan_tiles(
    device const int* words [[buffer(0)]],
    device int* plan [[buffer(1)]],
    constant MapSortParams& s [[buffer(2)]],
    uint tid [[thread_position_in_grid]]) {
  const long t = long(tid);
  const long n = s.count;
  if (t * MAP_PLAN_TILE >= n) {
    return;
  }
  ulong m = 0;
  const long end = (t + 1) * MAP_PLAN_TILE < n ? (t + 1) * MAP_PLAN_TILE : n;
  for (long i = t * MAP_PLAN_TILE; i < end; ++i) {
    m |= map_load(words, s, i).key;
  }
  device int* w = plan + 2 * t;
  w[0] = int(uint(m));
  w[1] = int(uint(m >> 32));
}
