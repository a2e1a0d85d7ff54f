// Forward / input-gradient CPU kernel: blocked gather-GEMM.
//
// Output rows are cut into blocks whose float32 accumulators stay in L2.
// Within a block, edges are taken grouped by kernel offset (from the
// relation's offset groups, made once per relation and view, else grouped
// here per block); each group of MR edges gathers MR input rows and
// multiplies them by the packed W[k] in a register tile, then adds the tile
// into the block's rows. No two edges of one offset
// share an output row, so a tile never conflicts with itself, and every
// output element sums its offsets in increasing order: the result does not
// depend on the thread count.
//
// A row's first offset adds its tile to a zero row and stores, later ones
// add to the row, and rows without edges are written as zeros, so the
// block is never zeroed first. Over 16 to 64 input channels (AVX2 and
// AVX-512) the tiles are software-pipelined: each tile's walk and row
// fetches run during an earlier tile's multiply-adds (staged_product).
// Float32 outputs whose width is whole vectors, where rows have few edges
// and short products, are accumulated in place (in the output itself, no
// copy out). Narrow inputs may take the row-major traversal instead
// (cpu.row_gather, below). Results are identical whichever way a call
// takes.
#include "cpu/isa_begin.h"

#include "cpu/pack.h"

namespace mlx_lattice::cpu::LATTICE_ISA {

namespace {

using simd::vec;

// The register tile's parts, shared by tile and staged_product.
template <int MR, int NV>
inline __attribute__((always_inline)) void zero_tile(vec (&acc)[MR][NV]) {
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      acc[i][j] = simd::zero();
    }
  }
}

// acc[i] += x(i)[0] w over the tile's columns: x(i) is row i's current
// input channel, w that channel's packed weights.
template <int MR, int NV, typename X>
inline __attribute__((always_inline)) void channel_step(vec (&acc)[MR][NV], const float* w, X&& x) {
  vec wv[NV];
#pragma GCC unroll 4
  for (int j = 0; j < NV; ++j) {
    wv[j] = simd::load(w + j * simd::kWidth);
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    const vec xb = simd::broadcast_load(x(i));
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      acc[i][j] = simd::fma(xb, wv[j], acc[i][j]);
    }
  }
}

// yr[i] = sr[i] + acc[i] over columns [off, off + NV vectors).
template <int MR, int NV>
inline __attribute__((always_inline)) void add_tile(
    const vec (&acc)[MR][NV], const float* const* sr, float* const* yr, int off) {
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      const int c = off + j * simd::kWidth;
      simd::store(yr[i] + c, simd::load(sr[i] + c) + acc[i][j]);
    }
  }
}

// yr[i] = sr[i] + x_i W_k over the tile's columns; sr[i] is yr[i] (add) or
// a zero row (a row's first offset, written in place).
template <int MR, int NV>
inline void tile(
    const float* const* xr,
    const float* wk,
    int A,
    const float* const* sr,
    float* const* yr,
    int off = 0) {
  constexpr int W = NV * simd::kWidth;
  vec acc[MR][NV];
  zero_tile(acc);
  for (int a = 0; a < A; ++a) {
    channel_step(acc, wk + a * W, [&](int i) { return xr[i] + a; });
  }
  add_tile(acc, sr, yr, off);
}

// The same, compiled apart: a tile that takes nearly all the vector
// registers (three or four vectors of 32 registers, any tile of AVX2's 16),
// inlined into the traversal below, has the compiler keep some of the
// traversal's values in them and spill weight vectors instead (AVX-512 C64
// forward 20% slower, AVX2 mesh C32 4%). Narrower AVX-512 tiles gain from
// inlining (C32 forward 5%).
template <int MR, int NV>
__attribute__((noinline)) void tile_apart(
    const float* const* xr,
    const float* wk,
    int A,
    const float* const* sr,
    float* const* yr,
    int off) {
  tile<MR, NV>(xr, wk, A, sr, yr, off);
}

// Column blocks that share one walk over a block's edges hold at most this
// many bytes of weights per offset between them: half of a 32 KB L1 (AVX2
// cores such as Zen 3), leaving room for the tile's rows. The AVX-512 C128
// forward, whose two blocks hold 64 KB, ran 6% slower sharing; with 48 KB
// of L1, 24 KB (three AVX2 C128 blocks instead of two) measured 3% faster,
// within noise.
constexpr int64_t kSharedWeightBytes = 16 << 10;

// Rows of the grouped traversal's register tile: at most 12, so that the
// gathered rows' pointers and the loop's own stay in the 16 general
// registers (14 rows spill three pointers per input channel; C32 forward
// 3% slower).
template <int NV>
constexpr int grouped_rows() {
  return std::min(simd::rows_for(NV), 12);
}

// A block's edges grouped by kernel offset: offset k's are rows / gather
// [range[k].first, range[k].second), rows (absolute) ascending.
struct BlockGroups {
  const int32_t* rows = nullptr;
  const int32_t* gather = nullptr;
  std::vector<std::pair<int32_t, int32_t>> range;
};

// Rows [r0, r1) of the view's offset groups made once for the relation:
// within each offset's segment, the rows ascend, so the block's edges are
// the run found by binary search.
void cached_groups(const CsrView& v, int64_t K, int64_t r0, int64_t r1, BlockGroups& b) {
  b.rows = v.group_rows;
  b.gather = v.group_gather;
  b.range.resize(K);
  for (int64_t k = 0; k < K; ++k) {
    const int32_t* s0 = v.group_rows + v.segments[2 * k];
    const int32_t* s1 = v.group_rows + v.segments[2 * k + 1];
    const int32_t* lo = std::lower_bound(s0, s1, static_cast<int32_t>(r0));
    const int32_t* hi = std::lower_bound(lo, s1, static_cast<int32_t>(r1));
    b.range[k] = {static_cast<int32_t>(lo - v.group_rows), static_cast<int32_t>(hi - v.group_rows)};
  }
}

// Edges of rows [r0, r1) grouped by kernel offset here, for views handed
// without their offset groups (pointwise products, cpu.row_gather's
// fallback, callers of the kernel outside a relation): a counting sort of
// the block's edges, rows ascending within each offset.
struct BlockSort {
  std::vector<int32_t> offsets; // per kernel offset, into out/in
  std::vector<int32_t> out;     // output row
  std::vector<int32_t> in;      // gathered row
};

void group_edges(const CsrView& v, int64_t K, int64_t r0, int64_t r1, BlockSort& s, BlockGroups& b) {
  s.offsets.assign(K + 1, 0);
  if (!v.offsets) {
    s.offsets[1] = static_cast<int32_t>(r1 - r0);
    s.out.resize(r1 - r0);
    for (int64_t r = r0; r < r1; ++r) {
      s.out[r - r0] = static_cast<int32_t>(r);
    }
    b.rows = b.gather = s.out.data();
    b.range.assign(K, {0, 0});
    b.range[0] = {0, static_cast<int32_t>(r1 - r0)};
    return;
  }
  const int64_t e0 = v.offsets[r0], e1 = v.offsets[r1];
  for (int64_t e = e0; e < e1; ++e) {
    ++s.offsets[v.k[e] + 1];
  }
  for (int64_t k = 0; k < K; ++k) {
    s.offsets[k + 1] += s.offsets[k];
  }
  s.out.resize(e1 - e0);
  s.in.resize(e1 - e0);
  b.range.resize(K);
  for (int64_t k = 0; k < K; ++k) {
    b.range[k] = {s.offsets[k], s.offsets[k]};
  }
  // (Raw pointers: the stores could otherwise alias the vectors' own.)
  const int32_t* row = v.offsets;
  const int32_t* ks = v.k;
  const int32_t* gather = v.gather;
  auto* range = b.range.data();
  int32_t* out = s.out.data();
  int32_t* in = s.in.data();
  for (int64_t r = r0; r < r1; ++r) {
    for (int32_t e = row[r]; e < row[r + 1]; ++e) {
      const int32_t dst = range[ks[e]].second++;
      out[dst] = static_cast<int32_t>(r);
      in[dst] = gather[e];
    }
  }
  b.rows = out;
  b.gather = in;
}

// A tile's row pointers: gathered inputs, the sums it adds to (a row's
// own, or a zero row for its first offset) and the rows it writes.
template <int MR>
struct TileRows {
  const float* x[MR];
  const float* s[MR];
  float* y[MR];
  const float* wk;
};

// Columns [c0, c0 + nb * NV vectors) of the block's rows [r0, ...): nb > 1
// (Shared) column blocks of NV vectors take each tile in turn, so the walk
// below runs once for all of them (AVX2 C32-C64 forward 8-11% faster than a
// walk per block). Offsets are visited in increasing order, so the first
// edge of a row met here starts its sum (adds to a zero row): seen[row]
// marks the rows met so far, and after the pass, the rows that have edges.
// Each tile's pointers are made one tile ahead, in the same pass that
// prefetches its rows: the gathered rows are scattered in memory, and the
// row indices are then read once.
template <int NV, bool Shared>
void block_product(
    const BlockGroups& b,
    int64_t K,
    int64_t r0,
    const float* xf,
    int A,
    const float* packed,
    int c0,
    int nb,
    float* yblk,
    int ldy,
    uint8_t* seen,
    const float* zero_row,
    float* dummy_row) {
  constexpr int MR = grouped_rows<NV>();
  constexpr int W = NV * simd::kWidth;
  const int32_t* rows = b.rows;
  const int32_t* gather = b.gather;
  const int64_t x_bytes = int64_t(A) * 4;
  // Fills t with the n edges from g on (the rest padded with a zero input
  // row written to a scratch row) and fetches their rows.
  auto fill = [&](int32_t g, int n, TileRows<MR>& t) {
    for (int i = 0; i < n; ++i) {
      const int64_t r = rows[g + i] - r0;
      const float* x = xf + int64_t(gather[g + i]) * A;
      float* y = yblk + r * ldy + c0;
      t.x[i] = x;
      t.y[i] = y;
      t.s[i] = seen[r] ? y : zero_row;
      seen[r] = 1;
      // (The rows written are not fetched: in place, where they are the
      // output's own, prefetching them for writing measured 5% slower at
      // C32, the extra requests competing with the gathered rows'.)
      const char* p = reinterpret_cast<const char*>(x);
      for (int64_t off = 0; off < x_bytes; off += 64) {
        __builtin_prefetch(p + off);
      }
    }
    for (int i = n; i < MR; ++i) {
      t.x[i] = zero_row;
      t.y[i] = dummy_row;
      t.s[i] = dummy_row;
    }
  };
  // The tiles in order: offsets ascending, MR edges at a time.
  int64_t k = 0;
  int32_t g = 0, g1 = 0;
  auto next = [&](TileRows<MR>& t) -> bool {
    while (g >= g1) {
      if (k == K) {
        return false;
      }
      g = b.range[k].first;
      g1 = b.range[k].second;
      t.wk = packed_block(packed, K, A, c0, W, k);
      ++k;
    }
    const int n = std::min<int32_t>(MR, g1 - g);
    fill(g, n, t);
    g += n;
    return true;
  };
  TileRows<MR> tiles[2];
  int cur = 0;
  if (!next(tiles[cur])) {
    return;
  }
  for (;;) {
    tiles[cur ^ 1].wk = tiles[cur].wk;
    const bool more = next(tiles[cur ^ 1]);
    const TileRows<MR>& t = tiles[cur];
    if constexpr (Shared) {
      // Every column block of the group over the same gathered rows (in L1
      // after the first): the rows' pointers are made once for all of them.
      // (Block c0 + off's weights for an offset lie off * K * A past c0's.)
      for (int cb = 0; cb < nb; ++cb) {
        const int off = cb * W;
        tile_apart<MR, NV>(t.x, t.wk + int64_t(off) * K * A, A, t.s, t.y, off);
      }
    } else if constexpr (NV <= 2 && simd::kRegisters > 16) {
      tile<MR, NV>(t.x, t.wk, A, t.s, t.y);
    } else {
      tile_apart<MR, NV>(t.x, t.wk, A, t.s, t.y, 0);
    }
    if (!more) {
      break;
    }
    cur ^= 1;
  }
}

// A tile of the staged traversal below: its rows and weights (TileRows)
// and where its n edges lie in the offset groups.
template <int MR>
struct StagedTile : TileRows<MR> {
  const int32_t* rows;
  const int32_t* gather;
  int n;
};

// block_product with A input channels known at compile time: the same
// tiles in the same order, summed alike (the same bits), but software-
// pipelined over three tiles. While tile t's multiply-adds run, tile
// t + 1's gathered rows are copied into a contiguous panel and tile t + 2's
// pointers are made and its rows prefetched, one edge every A / MR input
// channels. The multiply-adds then read the panel at fixed offsets, so they
// need no row pointers, and the walk gets the general registers they held:
// interleaved with the multiply-adds rather than run between tiles, where
// it did not overlap them. A group's further column blocks (shared walk)
// run over the same panel after the first. OneBlock: one block spans the
// output, so the rows' stride is known here.
//
// Measured against block_product (LiDAR unless named): AVX-512 C32 forward
// +5%, input gradient +6%, C16 +8-16%, C48 +3%, C64 even, 32 -> 128 +5%;
// AVX2 C16 +12-17%, C32 +6-10% (mesh +6%), C64 and 64 -> 128 +3-5%.
template <int A, int NV, bool OneBlock>
void staged_product(
    const BlockGroups& b,
    int64_t K,
    int64_t r0,
    const float* xf,
    const float* packed,
    int c0,
    int nb,
    float* yblk,
    int ldy_,
    uint8_t* seen,
    const float* zero_row,
    float* dummy_row) {
  constexpr int W = NV * simd::kWidth;
  constexpr int MR = grouped_rows<NV>();
  // Tile t's edge i is walked, and tile t - 1's copied, at input channel
  // (i + 1) * spacing - 1 of tile t - 2's first block.
  constexpr int spacing = A / MR;
  static_assert(spacing >= 1, "at least one input channel per edge");
  const int64_t ldy = OneBlock ? W : ldy_;
  const int32_t* rows = b.rows;
  const int32_t* gather = b.gather;
  const auto* range = b.range.data();
  // Indexed by absolute row.
  float* const yb = yblk - r0 * ldy + (OneBlock ? 0 : c0);
  uint8_t* const seenb = seen - r0;
  int64_t k = 0;
  int32_t g = 0, g1 = 0;
  const float* wk_k = packed;
  // The next tile's offset, weights and edges (n = 0: none left).
  auto start = [&](StagedTile<MR>& t) {
    while (g >= g1) {
      if (k == K) {
        t.n = 0;
        return;
      }
      g = range[k].first;
      g1 = range[k].second;
      wk_k = packed_block(packed, K, A, OneBlock ? 0 : c0, W, k);
      ++k;
    }
    t.wk = wk_k;
    t.n = std::min<int32_t>(MR, g1 - g);
    t.rows = rows + g;
    t.gather = gather + g;
    g += t.n;
  };
  // Edge i's pointers, as block_product's fill: tiles are walked in order,
  // so seen[] marks the rows met by earlier tiles, whose sums are also
  // written (below) before this tile's.
  auto walk_edge = [&](StagedTile<MR>& t, int i) __attribute__((always_inline)) {
    if (i < t.n) {
      const int64_t r = t.rows[i];
      const float* x = xf + int64_t(t.gather[i]) * A;
      float* y = yb + r * ldy;
      t.x[i] = x;
      t.y[i] = y;
      t.s[i] = seenb[r] ? y : zero_row;
      seenb[r] = 1;
      // (Here, unlike in block_product, fetching the row to be written
      // pays: LiDAR C16-C32 forward 2-6% faster, in place.)
      const char* q = reinterpret_cast<const char*>(y);
#pragma GCC unroll 4
      for (int off = 0; off < W * 4; off += 64) {
        __builtin_prefetch(q + off, 1);
      }
      const char* p = reinterpret_cast<const char*>(x);
#pragma GCC unroll 8
      for (int off = 0; off < A * 4; off += 64) {
        __builtin_prefetch(p + off);
      }
    } else {
      t.x[i] = zero_row;
      t.y[i] = dummy_row;
      t.s[i] = dummy_row;
    }
  };
  // Edge i's gathered row (prefetched one tile earlier) into the panel.
  auto copy_edge = [&](const StagedTile<MR>& t, float* panel, int i)
                       __attribute__((always_inline)) {
    const float* x = t.x[i];
#pragma GCC unroll 8
    for (int v = 0; v < A; v += simd::kWidth) {
      simd::store(panel + i * A + v, simd::load(x + v));
    }
  };
  // The first two tiles walked and the first copied, then per tile: start
  // tile t + 2, the multiply-adds of t over its panel with t + 1's copy and
  // t + 2's walk between them, t's sums written.
  alignas(64) float panels[2][MR * A];
  StagedTile<MR> st[3];
  StagedTile<MR>* cur = &st[0];
  StagedTile<MR>* nx = &st[1];
  StagedTile<MR>* nn = &st[2];
  start(*cur);
  if (cur->n == 0) {
    return;
  }
  for (int i = 0; i < MR; ++i) {
    walk_edge(*cur, i);
  }
  start(*nx);
  for (int i = 0; i < MR; ++i) {
    walk_edge(*nx, i);
  }
  for (int i = 0; i < MR; ++i) {
    copy_edge(*cur, panels[0], i);
  }
  float* pc = panels[0];
  float* pn = panels[1];
  for (;;) {
    start(*nn);
    const float* wk = cur->wk;
    vec acc[MR][NV];
    zero_tile(acc);
    auto step = [&]<int a>() __attribute__((always_inline)) {
      channel_step(acc, wk + a * W, [&](int i) { return pc + i * A + a; });
      if constexpr (a % spacing == spacing - 1 && a / spacing < MR) {
        copy_edge(*nx, pn, a / spacing);
        walk_edge(*nn, a / spacing);
      }
    };
    [&]<int... As>(std::integer_sequence<int, As...>) {
      (step.template operator()<As>(), ...);
    }(std::make_integer_sequence<int, A>{});
    add_tile(acc, cur->s, cur->y, 0);
    if constexpr (!OneBlock) {
      // The group's other blocks over the same panel, compiled apart:
      // inlined, their loops took the registers the walk above needs
      // (AVX2 C64 and AVX-512 64 -> 128 then ran at half speed).
      if (nb > 1) {
        const float* xr[MR];
        for (int i = 0; i < MR; ++i) {
          xr[i] = pc + i * A;
        }
        for (int cb = 1; cb < nb; ++cb) {
          const int off = cb * W;
          tile_apart<MR, NV>(xr, cur->wk + int64_t(off) * K * A, A, cur->s, cur->y, off);
        }
      }
    }
    if (nx->n == 0) {
      break;
    }
    StagedTile<MR>* t = cur;
    cur = nx;
    nx = nn;
    nn = t;
    std::swap(pc, pn);
  }
}

// Whether staged_product is compiled for A input channels: 16 to 64 in
// steps of 16, on the paths with 8- and 16-float vectors (wider products
// leave the walk little to hide, and its fully unrolled channel loop grows
// with A).
constexpr bool staged_channels(int A) {
  return simd::kWidth >= 8 && A >= 16 && A <= 64 && A % 16 == 0;
}

// Runs fn.template operator()<A, NV>() where staged_channels(A) and
// returns what it returns (whether it ran a staged product); false where
// not.
template <typename F>
bool staged_product_for(int A, int nv, F&& fn) {
  auto with = [&]<int AC>() {
    bool ran = false;
    dispatch_vectors(nv, [&]<int NV>() { ran = fn.template operator()<AC, NV>(); });
    return ran;
  };
  switch (A) {
    case 16:
      return with.template operator()<16>();
    case 32:
      return with.template operator()<32>();
    case 48:
      return with.template operator()<48>();
    case 64:
      return with.template operator()<64>();
    default:
      return false;
  }
}

// Row-major traversal (cpu.row_gather), for narrow inputs (C_in <= 8),
// whose products are too short for the grouping by offset, the row
// pointers and the read-modify-write of output rows to pay off: edges are
// taken in the view's own order, M at a time in lockstep, each product
// x_e W_k summed from zero in its own register tile, then added into its
// row's running sum in increasing offset order (0 + first, then each next)
// and the row written once. These are the grouped path's sums exactly: the
// same bits whichever traversal runs.
constexpr int row_major_edges(int nv) {
  // M * NV accumulators, one broadcast and a weight vector; at most 6 so
  // that the two pointers per edge stay in general registers.
  int m = (simd::kRegisters - 2) / nv;
  return m > 6 ? 6 : (m < 1 ? 1 : m);
}

// Products of M edges in lockstep: out[i] = x_i W_{k_i} over the column
// block, each summed from zero in input-channel order.
template <int M, int NV, int AC>
inline void edge_tile(const float* const* xr, const float* const* wr, int A_, float* out) {
  constexpr int W = NV * simd::kWidth;
  const int A = AC > 0 ? AC : A_;
  vec acc[M][NV];
#pragma GCC unroll 8
  for (int i = 0; i < M; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      acc[i][j] = simd::zero();
    }
  }
#pragma GCC unroll 8
  for (int a = 0; a < A; ++a) {
#pragma GCC unroll 8
    for (int i = 0; i < M; ++i) {
      const vec xb = simd::broadcast_load(xr[i] + a);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) {
        acc[i][j] = simd::fma(xb, simd::load(wr[i] + a * W + j * simd::kWidth), acc[i][j]);
      }
    }
  }
  // Through memory: kept in registers, the branches of the row sums below
  // pull the products into them.
#pragma GCC unroll 8
  for (int i = 0; i < M; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      simd::store(out + i * W + j * simd::kWidth, acc[i][j]);
    }
  }
}

// Columns [c0, c0 + NV vectors) of rows [r0, r1), written to
// acc + (r - r0) * ld + c0. Returns false when some row's edges do not
// ascend in offset (the order its sums take); the caller then runs the
// grouped path over the block, which rewrites every row.
template <int NV, int AC>
bool row_major_block(
    const CsrView& v,
    int64_t K,
    const float* xf,
    int A,
    const float* packed,
    int c0,
    int64_t r0,
    int64_t r1,
    const float* zero_row,
    float* acc,
    int64_t ld) {
  constexpr int M = row_major_edges(NV);
  constexpr int W = NV * simd::kWidth;
  alignas(64) float products[M * W];
  const int32_t* offsets = v.offsets;
  const int32_t* gather = v.gather;
  const int32_t* ks = v.k;
  const float* panel = packed_block(packed, K, A, c0, W, 0);
  const int64_t panel_stride = int64_t(A) * W;
  const int32_t e1 = offsets[r1];
  int64_t r = r0;
  int32_t end = offsets[r + 1];
  bool open = false; // row r has had an edge
  int32_t last_k = -1;
  vec s[NV];
  // Row r's sum, or zeros for a row without edges.
  auto close = [&]() {
    float* dst = acc + (r - r0) * ld + c0;
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      simd::store(dst + j * simd::kWidth, open ? s[j] : simd::zero());
    }
    ++r;
    end = r < r1 ? offsets[r + 1] : e1;
    open = false;
  };
  for (int32_t e = offsets[r0]; e < e1; e += M) {
    const int n = std::min<int32_t>(M, e1 - e);
    const float* xr[M];
    const float* wr[M];
    for (int i = 0; i < M; ++i) {
      xr[i] = i < n ? xf + int64_t(gather[e + i]) * A : zero_row;
      wr[i] = i < n ? panel + ks[e + i] * panel_stride : panel;
    }
    // The next tile's gathered rows: scattered in memory.
    for (int32_t i = e + M; i < std::min<int32_t>(e + 2 * M, e1); ++i) {
      const char* p = reinterpret_cast<const char*>(xf + int64_t(gather[i]) * A);
      for (int64_t off = 0; off < int64_t(A) * 4; off += 64) {
        __builtin_prefetch(p + off);
      }
    }
    edge_tile<M, NV, AC>(xr, wr, A, products);
    for (int i = 0; i < n; ++i) {
      while (e + i >= end) {
        close();
      }
      const int32_t k = ks[e + i];
      if (open && k <= last_k) {
        return false;
      }
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) {
        s[j] = (open ? s[j] : simd::zero()) + simd::load(products + i * W + j * simd::kWidth);
      }
      open = true;
      last_k = k;
    }
  }
  while (r < r1) {
    close();
  }
  return true;
}

// Every column block of rows [r0, r1) on the row-major traversal; false as
// row_major_block.
inline bool row_major_rows(
    const CsrView& v,
    int64_t K,
    const float* xf,
    int A,
    const float* packed,
    const std::vector<std::pair<int, int>>& blocks,
    int64_t r0,
    int64_t r1,
    const float* zero_row,
    float* acc,
    int64_t ld) {
  bool ordered = true;
  for (auto [c0, nv] : blocks) {
    dispatch_vectors(nv, [&]<int NV>() {
      auto run = [&]<int AC>() {
        ordered = row_major_block<NV, AC>(v, K, xf, A, packed, c0, r0, r1, zero_row, acc, ld);
      };
      // The stem's input widths: the loop over input channels unrolled.
      switch (A) {
        case 1:
          run.template operator()<1>();
          break;
        case 3:
          run.template operator()<3>();
          break;
        case 4:
          run.template operator()<4>();
          break;
        default:
          run.template operator()<0>();
      }
    });
    if (!ordered) {
      return false;
    }
  }
  return true;
}

// Float32 input rows; narrower dtypes are widened once up front (widening
// inside the tile as rows are broadcast measured slower on AVX-512).
template <typename T>
void run_packed(
    const T* x,
    const std::vector<float>& packed,
    CsrView v,
    int64_t n_x,
    int64_t K,
    int A,
    int B,
    T* y) {
  Scratch xbuf;
  const float* xf = float_rows(x, n_x, A, xbuf);
  const int bp = static_cast<int>(round_up(B, simd::kWidth));
  const auto blocks = column_blocks(bp);
  // In place where a row's products are short (edges per row x A <= 200;
  // 450 over the staged traversal): the block's copy out then weighs
  // against them (measured on MinkUNet's layers: 10-25% less time on the
  // strided layers and C16, 2-9% at C32 with 8 edges a row), while longer
  // rows amortise it and gain from accumulating in L2 (over block_product,
  // C48-C64 at 5-8 edges a row: 2-6% slower in place; the mesh's 14 edges a
  // row: 1-4%). The staged traversal fetches the rows it writes ahead, so
  // its C48-C64 at 5-7 edges a row and mesh C32 run 2-6% faster in place.
  const bool y_direct = std::is_same_v<T, float> && bp == B;
  const bool in_place = y_direct && v.edges * A <= (staged_channels(A) ? 450 : 200) * v.rows;
  // Block rows, fixed by the problem alone (the sums do not depend on
  // them): 256 KiB of float32 accumulators, in L2 even on cores with 512 KiB
  // of it, or where rows are summed in place and L2 holds 1 MiB or more,
  // 512 KiB of rows up to 4096, which leaves fewer part-filled tiles per
  // offset (LiDAR C16-C32 2-5% faster than 2048 rows, C48-C64 1-3%); at
  // least 8 blocks where there are rows enough, so that threads finish
  // together.
  const int64_t block_floats = int64_t(1) << (in_place && l2_cache_bytes() >= (1 << 20) ? 17 : 16);
  const int64_t rows_per_block =
      std::clamp<int64_t>(std::min<int64_t>(block_floats / bp, (v.rows + 7) / 8), 16, 4096);
  const bool row_major = v.row_major && v.offsets;
  parallel_for(v.rows, rows_per_block, [&](int64_t r0, int64_t r1) {
    thread_local BlockGroups groups;
    thread_local BlockSort sorted;
    thread_local std::vector<uint8_t> seen;
    thread_local std::vector<float> yblk, dummy_row, zero_row;
    zero_row.assign(std::max(A + 1, bp), 0.0f);
    // The block's accumulator: y's own rows when float32 rows are summed in
    // place, else the block buffer (converted out afterwards). Never zeroed:
    // each row's first offset stores, and rows without edges are written.
    auto accumulator = [&](bool direct) -> float* {
      if constexpr (std::is_same_v<T, float>) {
        if (direct) {
          return y + r0 * B;
        }
      }
      yblk.resize((r1 - r0) * bp);
      return yblk.data();
    };
    if (row_major) {
      float* acc = accumulator(y_direct);
      if (row_major_rows(v, K, xf, A, packed.data(), blocks, r0, r1, zero_row.data(), acc, bp)) {
        if (acc == yblk.data()) {
          for (int64_t r = r0; r < r1; ++r) {
            from_float(yblk.data() + (r - r0) * bp, y + r * B, B);
          }
        }
        return;
      }
    }
    if (v.segments) {
      cached_groups(v, K, r0, r1, groups);
    } else {
      group_edges(v, K, r0, r1, sorted, groups);
    }
    float* acc = accumulator(in_place);
    dummy_row.assign(bp, 0.0f);
    seen.assign(r1 - r0, 0);
    for (size_t i = 0; i < blocks.size();) {
      // Consecutive column blocks of one width share a walk while their
      // weights for one offset fit kSharedWeightBytes (AVX2: 8 blocks at
      // C_in = 32, 2 at 128; AVX-512: 2 at C_in = 32, one from 48); each
      // walk starts the rows' sums afresh.
      const auto [c0, nv] = blocks[i];
      const int64_t block_weights = int64_t(A) * nv * simd::kWidth * 4;
      const size_t most = std::max<int64_t>(1, kSharedWeightBytes / block_weights);
      size_t j = i + 1;
      while (j < blocks.size() && j - i < most && blocks[j].second == nv) {
        ++j;
      }
      std::fill(seen.begin(), seen.end(), 0);
      // The staged traversal where it is compiled (staged_channels).
      if constexpr (simd::kWidth >= 8) {
        const bool one = blocks.size() == 1;
        const int nb = static_cast<int>(j - i);
        // Within a wider output only full-width blocks are staged: the
        // last, narrower block of a width that is not a whole number of
        // blocks (96 on AVX-512, 24 on AVX2) takes block_product, which
        // spares this file's widest paths a third of their compile time.
        if (staged_product_for(A, nv, [&]<int AC, int NV>() {
              if (one) {
                staged_product<AC, NV, true>(
                    groups, K, r0, xf, packed.data(), 0, 1, acc, bp, seen.data(),
                    zero_row.data(), dummy_row.data());
                return true;
              }
              if constexpr (NV == simd::kMaxVectors) {
                staged_product<AC, NV, false>(
                    groups, K, r0, xf, packed.data(), c0, nb, acc, bp, seen.data(),
                    zero_row.data(), dummy_row.data());
                return true;
              }
              return false;
            })) {
          i = j;
          continue;
        }
      }
      auto product = [&]<int NV>() {
        if (j - i > 1) {
          block_product<NV, true>(
              groups, K, r0, xf, A, packed.data(), c0, static_cast<int>(j - i), acc, bp,
              seen.data(), zero_row.data(), dummy_row.data());
        } else {
          block_product<NV, false>(
              groups, K, r0, xf, A, packed.data(), c0, 1, acc, bp, seen.data(),
              zero_row.data(), dummy_row.data());
        }
      };
      dispatch_vectors(nv, product);
      i = j;
    }
    if (in_place) {
      for (int64_t r = r0; r < r1; ++r) {
        if (!seen[r - r0]) {
          std::fill(acc + (r - r0) * B, acc + (r - r0 + 1) * B, 0.0f);
        }
      }
    } else {
      for (int64_t r = r0; r < r1; ++r) {
        from_float(seen[r - r0] ? yblk.data() + (r - r0) * bp : zero_row.data(), y + r * B, B);
      }
    }
  });
}

template <typename T>
void run(
    const T* x,
    const T* w,
    WeightStrides ws,
    CsrView v,
    int64_t n_x,
    int64_t K,
    int A,
    int B,
    T* y) {
  run_packed(x, pack_weights(w, ws, K, A, B), v, n_x, K, A, B, y);
}

} // namespace

void gather_conv(
    Float t,
    const void* x,
    const void* w,
    WeightStrides ws,
    CsrView v,
    int64_t n_x,
    int64_t K,
    int A,
    int B,
    void* y) {
  dispatch_float(t, [&]<typename T>() {
    run<T>(
        static_cast<const T*>(x), static_cast<const T*>(w), ws, v, n_x, K, A, B,
        static_cast<T*>(y));
  });
}

void gather_conv_quantized(
    Float t,
    Float s,
    const void* x,
    const uint32_t* codes,
    const void* scales,
    const void* biases,
    int bits,
    int group,
    CsrView v,
    int64_t n_x,
    int64_t K,
    int A,
    int B,
    void* y) {
  dispatch_float(t, [&]<typename T>() {
    dispatch_float(s, [&]<typename S>() {
      auto packed = pack_quantized_weights(
          codes, static_cast<const S*>(scales), static_cast<const S*>(biases), bits, group, K, A, B);
      run_packed(static_cast<const T*>(x), packed, v, n_x, K, A, B, static_cast<T*>(y));
    });
  });
}

} // namespace mlx_lattice::cpu::LATTICE_ISA

#include "cpu/isa_end.h"
