// Weight-gradient CPU kernel: dW[k] = sum over edges of offset k of
// x[g]^T ct[r], as blocked GEMMs over packed edge panels.
//
// The edges of each offset are cut into chunks whose size depends only on
// the problem; each chunk packs panels of gathered rows (float32) and
// accumulates into its own partial sum with register tiles. Partials are
// reduced in chunk order, so results do not depend on the thread count.
// Nothing is zeroed ahead: a chunk's first sub-panel (or panel) writes its
// partial sum, its register tiles starting at zero, and later ones
// accumulate: the same multiply-adds as into a zeroed sum. Which thread
// runs a chunk, and when, changes no bit: only the order of each chunk's
// own edges matters, and every traversal keeps it.
//
// A tile broadcasts one side's channels and holds the other's in vectors.
// Which side fills the vectors is chosen per problem and path, for the one
// with less padding (a classifier's C_out = 4 would fill a quarter of each
// AVX-512 vector; its C_in = 48 fills them): the element sums are the same
// fused multiply-adds in the same edge order either way, so the choice
// changes no bit.
#include "cpu/isa_begin.h"

#include <algorithm>
#include <array>
#include <memory>

#include "cpu/pack.h"

namespace mlx_lattice::cpu::LATTICE_ISA {

namespace {

using simd::vec;

// Edges packed at a time: as many as keep a column block of the vector
// side's panel (kMaxVectors vectors per edge) within 16 KB of L1, where each
// row tile re-reads it. At 256 edges the AVX-512 block (256 B per edge) was
// 64 KB, read from L2: C128 weight gradients were 8-10% slower (float16 C64
// 12%); on AVX2 (64 B per edge) 256 edges remain the fastest measured.
constexpr int64_t kPanel = std::min(256, 4096 / (simd::kMaxVectors * simd::kWidth));
constexpr int64_t kMinChunkEdges = 512; // average edges of a chunk (see run)

struct Chunk {
  int64_t k, e0, e1;
};

// acc[i][0:NV vectors] += sum over e in [e0, e1) of x_e[i] * c_e[0:NV vectors],
// where rows(e) gives the pointers (x_e, c_e) of edge e's two rows; with
// first, acc is written instead (its prior contents are not read).
template <int MR, int NV, typename Rows>
inline void tile(Rows rows, int64_t e0, int64_t e1, float* acc, int lda, bool first) {
  vec t[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      t[i][j] = first ? simd::zero() : simd::load(acc + int64_t(i) * lda + j * simd::kWidth);
    }
  }
  for (int64_t e = e0; e < e1; ++e) {
    const auto [xr, cr] = rows(e);
    vec cv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      cv[j] = simd::load(cr + j * simd::kWidth);
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const vec xb = simd::broadcast_load(xr + i);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) {
        t[i][j] = simd::fma(xb, cv[j], t[i][j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      simd::store(acc + int64_t(i) * lda + j * simd::kWidth, t[i][j]);
    }
  }
}

// Rows of a register tile: as many as the vector registers hold (the rows
// are consecutive channels of one gathered row, so unlike the forward's
// tiles they need no general register each), up to 16.
constexpr int tile_rows(int nv) {
  return std::min((simd::kRegisters - nv - 2) / nv, 16);
}

// Calls fn.template operator()<MR>() for a runtime MR in [1, kMax].
template <int MR, int kMax, typename F>
inline void with_rows(int mr, F&& fn) {
  if constexpr (MR <= kMax) {
    if (mr == MR) {
      fn.template operator()<MR>();
    } else {
      with_rows<MR + 1, kMax>(mr, fn);
    }
  }
}

// Height of the equal row tiles that split A rows into tiles no taller
// than max_rows, so that the last is not mostly padding (A = 32 -> 11 + 11
// + 10).
inline int tile_height(int A, int max_rows) {
  const int tiles = (A + max_rows - 1) / max_rows;
  return (A + tiles - 1) / tiles;
}

template <int NV>
void panel_product(
    const float* xp,
    int ldx,
    const float* cp,
    int ldc,
    int64_t n,
    int A,
    int c0,
    float* acc,
    int lda,
    bool first) {
  constexpr int kMaxRows = tile_rows(NV);
  with_rows<1, kMaxRows>(tile_height(A, kMaxRows), [&]<int MR>() {
    for (int a0 = 0; a0 < A; a0 += MR) {
      // packed panels: edge e's rows are the panels' rows e
      auto rows = [=](int64_t e) { return std::pair{xp + a0 + e * ldx, cp + c0 + e * ldc}; };
      tile<MR, NV>(rows, 0, n, acc + int64_t(a0) * lda + c0, lda, first);
    }
  });
}

// Tile passes subpanel_product makes over A rows with NV = nv vectors.
inline int tile_passes(int A, int nv) {
  const int mr = tile_height(A, tile_rows(nv));
  return A / mr + (A % mr > 0);
}

// Direct path: float32 rows whose widths are whole vectors are read where
// they lie, one sub-panel of n edges at a time, edge i's rows at px[i] and
// pc[i]: every (column block, input-channel tile) pass runs over it while
// its rows are in L1.
template <int NV, typename Before>
void subpanel_product(
    const float* const* px,
    const float* const* pc,
    int A,
    int64_t n,
    int c0,
    float* acc,
    int lda,
    bool first,
    Before&& before) {
  constexpr int kMaxRows = tile_rows(NV);
  const int mr = tile_height(A, kMaxRows);
  const int full = A / mr;
  const int rest = A - full * mr;
  auto gathered = [=](int a0) {
    return [=](int64_t i) { return std::pair{px[i] + a0, pc[i] + c0}; };
  };
  with_rows<1, kMaxRows>(mr, [&]<int MR>() {
    for (int t = 0; t < full; ++t) {
      const int a0 = t * MR;
      before();
      tile<MR, NV>(gathered(a0), 0, n, acc + int64_t(a0) * lda + c0, lda, first);
    }
  });
  if (rest > 0) {
    with_rows<1, kMaxRows>(rest, [&]<int MR>() {
      const int a0 = full * mr;
      before();
      tile<MR, NV>(gathered(a0), 0, n, acc + int64_t(a0) * lda + c0, lda, first);
    });
  }
}

// Edges of a direct sub-panel: as many as keep their rows within 48 KB
// (each row tile re-reads them from L1): 64, or 32 for rows wider than
// 768 B (C128 -> 128 is 7% faster with 32 than with 64); 0 where 32 do not
// fit (the rows are then packed).
constexpr int64_t kSubpanel = 64;
constexpr int64_t kSubpanelBytes = 48 << 10;
inline int64_t subpanel_edges(int A, int B) {
  for (int64_t n = kSubpanel; n >= kSubpanel / 2; n /= 2) {
    if ((int64_t(A) + B) * 4 * n <= kSubpanelBytes) {
      return n;
    }
  }
  return 0;
}

// Direct path over edges [e0, e1) of one chunk: sub-panels outermost, so
// that each sub-panel's gathered rows are fetched once for all column
// blocks; the next sub-panel's rows are prefetched while this one computes,
// and during the last one the first sub-panel of the edges [n0, n1) that the
// caller runs next. The next sub-panel's row pointers are kept with the
// prefetches, so that the tile passes (12 per sub-panel at C = 32 on AVX2)
// read a pointer per row instead of an index, a multiply and an add. With
// `starts` (the range opens its chunk), the first sub-panel writes acc's
// rows [0, A) in every column block.
void gathered_product(
    const float* xf,
    int A,
    const float* cf,
    int B,
    const int32_t* g,
    const int32_t* r,
    int64_t e0,
    int64_t e1,
    const std::vector<std::pair<int, int>>& blocks,
    float* acc,
    int lda,
    bool starts = true,
    int64_t n0 = 0,
    int64_t n1 = 0) {
  const float* px[2][kSubpanel];
  const float* pc[2][kSubpanel];
  const int64_t sub = subpanel_edges(A, B);
  auto x_row = [=](int64_t e) { return xf + (g ? int64_t(g[e]) : e) * A; };
  auto c_row = [=](int64_t e) { return cf + (r ? int64_t(r[e]) : e) * B; };
  for (int64_t e = e0; e < std::min(e1, e0 + sub); ++e) {
    px[0][e - e0] = x_row(e);
    pc[0][e - e0] = c_row(e);
  }
  // The next sub-panel's prefetches are spread over this one's first tile
  // passes (at most 8), not issued at once: a burst of 64 rows' lines
  // (384 at C48) stalled on the line-fill buffers, and C32 weight gradients
  // were 3-5% slower. Over all passes, the last lines were requested too
  // late where there are many (AVX2 C64: 44 passes, 7% slower).
  int passes = 0;
  for (auto [col, nv] : blocks) {
    passes += tile_passes(A, nv);
  }
  const int spread = std::min(passes, 8);
  int cur = 0;
  for (int64_t s0 = e0; s0 < e1; s0 += sub, cur = 1 - cur) {
    const int64_t s1 = std::min(e1, s0 + sub);
    const bool first = starts && s0 == e0;
    const int64_t p0 = s1 < e1 ? s1 : n0;
    const int64_t p1 = s1 < e1 ? std::min(e1, s1 + sub) : std::min(n1, n0 + sub);
    const int64_t np = p1 - p0;
    for (int64_t e = p0; e < p1; ++e) {
      px[1 - cur][e - p0] = x_row(e);
      pc[1 - cur][e - p0] = c_row(e);
    }
    int64_t issued = 0;
    auto prefetch_to = [&](int64_t upto) {
      for (; issued < upto; ++issued) {
        const char* xr = reinterpret_cast<const char*>(px[1 - cur][issued]);
        const char* cr = reinterpret_cast<const char*>(pc[1 - cur][issued]);
        for (int64_t off = 0; off < int64_t(A) * 4; off += 64) {
          __builtin_prefetch(xr + off);
        }
        for (int64_t off = 0; off < int64_t(B) * 4; off += 64) {
          __builtin_prefetch(cr + off);
        }
      }
    };
    int pass = 0;
    auto before = [&] { ++pass; prefetch_to(np * std::min(pass, spread) / spread); };
    for (auto [col, nv] : blocks) {
      dispatch_vectors(nv, [&]<int NV>() {
        subpanel_product<NV>(px[cur], pc[cur], A, s1 - s0, col, acc, lda, first, before);
      });
    }
    prefetch_to(np);
  }
}

template <typename T>
void run(
    const T* x,
    const T* ct,
    PairView v,
    int64_t n_x,
    int64_t n_ct,
    int A,
    int B,
    WeightStrides os,
    T* out) {
  // Orientation: rows of x broadcast against vectors of ct, or (swap) rows
  // of ct against vectors of x, whichever pads less; on a tie, the one whose
  // vector side is contiguous in out. P is the broadcast side (width P), Q
  // the vector side (width Q).
  const int64_t pad_b = round_up(B, simd::kWidth) * A, pad_a = round_up(A, simd::kWidth) * B;
  // (The parameter's own layout, (C_out, K, C_in), has C_in contiguous:
  // written with C_out in vectors, each element went to its own line, and
  // the copy out took 15% of a C128 weight gradient at 3,160 rows.)
  const bool swap = pad_b > pad_a || (pad_b == pad_a && os.a == 1 && os.b != 1);
  const int P = swap ? B : A, Q = swap ? A : B;
  const int qp = static_cast<int>(round_up(Q, simd::kWidth));
  // Room for the last row tile (up to 16 rows) past P.
  const int pp = static_cast<int>(round_up(P, 16) + 16);
  const int64_t tile_floats = int64_t(pp) * qp;
  const auto blocks = column_blocks(qp);
  // Narrow dtypes are widened while packing, cheaper than whole-array copies.
  // Float32 rows are read in place while a 32-edge sub-panel of them fits
  // the L1 budget (A + B <= 384): at C128 -> 128 that is 7% faster than
  // packing (4% on AVX2). Wider rows gain more from contiguous panels than
  // they lose packing them (C256 -> 256 takes 8% less time packed).
  // Both ways sum every element's edges in order.
  const bool direct =
      std::is_same_v<T, float> && Q % simd::kWidth == 0 && subpanel_edges(A, B) > 0;
  Scratch xbuf, cbuf;
  const float* xf = direct ? float_rows(x, n_x, A, xbuf) : nullptr;
  const float* cf = direct ? float_rows(ct, n_ct, B, cbuf) : nullptr;
  // Chunks from the problem only (not the vector width, so that every path
  // sums in the same order). Edges are sorted by result row (row of ct)
  // within each offset; the chunks cut those rows into blocks and take,
  // block by block, every offset's edges into that block, so that the rows
  // of x and ct a block touches are fetched once for all offsets rather than
  // once per offset. Blocks hold about 512 KB of rows (to stay in L2) and
  // grow where the partial sums' memory bound requires or chunks would be
  // small (both bounds in the unswapped orientation's terms: the chunks
  // must not depend on the path's choice).
  const int64_t budget = int64_t(1) << 23; // floats
  const int64_t bound_floats = (round_up(A, 16) + 16) * round_up(B, 16);
  int64_t rows_per_block = 256;
  while (rows_per_block * (A + B) * 4 < (int64_t(1) << 19)) {
    rows_per_block *= 2;
  }
  while (rows_per_block < n_ct && (n_ct / rows_per_block + 1) * v.k * bound_floats > budget) {
    rows_per_block *= 2;
  }
  // A chunk of few edges spends more on its partial sum (zeroed, loaded and
  // stored by the tiles, then reduced: all A x B) than on products, as in
  // the coarse levels of a U-Net (~1000 edges per offset at C = 128): grow
  // the blocks until chunks average kMinChunkEdges edges.
  while (rows_per_block < n_ct &&
         v.edges < kMinChunkEdges * v.k * ((n_ct + rows_per_block - 1) / rows_per_block)) {
    rows_per_block *= 2;
  }
  const int64_t n_blocks = std::max<int64_t>(1, (n_ct + rows_per_block - 1) / rows_per_block);
  // Chunk (b, k) holds offset k's edges from where chunk (b - 1, k) ended
  // to the first one whose row is past block b: every edge lies in exactly
  // one chunk.
  // Offsets are cut in parallel: the scan reads every edge.
  std::vector<Chunk> chunks(n_blocks * v.k);
  parallel_for(v.k, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t b0 = v.offsets ? v.offsets[k] : 0;
      const int64_t b1 = v.offsets ? v.offsets[k + 1] : v.edges;
      int64_t e = b0;
      for (int64_t b = 0; b < n_blocks; ++b) {
        int64_t end = b1;
        if (b + 1 < n_blocks) {
          const int64_t row_end = (b + 1) * rows_per_block;
          if (v.offsets) {
            // A scan, not a bisection: r need not be sorted (views whose
            // result rows are the inputs), and then blocks only lose locality.
            end = e;
            while (end < b1 && v.r[end] < row_end) {
              ++end;
            }
          } else {
            end = std::min(b1, std::max(e, row_end));
          }
        }
        chunks[b * v.k + k] = {k, e, end};
        e = end;
      }
    }
  });
  // Left uninitialised: every chunk writes the rows and columns of its
  // partial that the reduction reads (zeroing it all, 8-12 MB for the large
  // layers, was serial work on the calling thread).
  std::unique_ptr<float[]> partial(new float[chunks.size() * tile_floats]);
  // The broadcast side's rows (and their indices), and the vector side's.
  const int32_t* g = v.offsets ? v.g : nullptr;
  const int32_t* r = v.offsets ? v.r : nullptr;
  const float* pf = swap ? cf : xf;
  const float* qf = swap ? xf : cf;
  const int32_t* pi = swap ? r : g;
  const int32_t* qi = swap ? g : r;
  // Scheduling: with enough blocks, a task is one whole block (its chunks for
  // every offset), so that a block's rows are fetched into one core's L2
  // rather than into both cores' for alternate offsets; on the direct path
  // that core walks the block's result rows in windows of 512 KB of rows,
  // each offset's edges into a window in turn, so that rows shared by
  // several offsets are reused from L2 where a block is larger than it
  // (the partial sums' bound and the chunks' minimum size grow the blocks
  // of the C32 and C64 layers to 1-2 MB of rows).
  // Each chunk still runs its own edges in order from its first sub-panel.
  const int64_t n_chunks = static_cast<int64_t>(chunks.size());
  const bool whole_blocks = n_blocks >= 4 * num_threads();
  const int64_t window_rows =
      std::max<int64_t>(kSubpanel, (int64_t(1) << 19) / ((int64_t(A) + B) * 4));
  const int32_t* rows_of = v.offsets ? v.r : nullptr; // result row of each edge
  parallel_for(n_chunks, whole_blocks ? v.k : 1, [&](int64_t c0, int64_t c1) {
    // Padding columns stay zero (the tiles read them); rows are overwritten
    // panel by panel, so a thread zeroes its panels only when the layout
    // changes: the widths too, as a narrower P or Q at the same padded width
    // would leave earlier values in the padding.
    thread_local std::vector<float> ppanel, qpanel;
    thread_local std::array<int, 4> zeroed_for{};
    if (!direct && zeroed_for != std::array<int, 4>{P, pp, Q, qp}) {
      ppanel.assign(kPanel * pp, 0.0f);
      qpanel.assign(kPanel * qp, 0.0f);
      zeroed_for = {P, pp, Q, qp};
    }
    if (direct && whole_blocks) {
      thread_local std::vector<int64_t> cur, end;
      cur.resize(v.k);
      end.resize(v.k);
      for (int64_t b = c0 / v.k; b < c1 / v.k; ++b) {
        const Chunk* ch = chunks.data() + b * v.k;
        float* acc = partial.get() + b * v.k * tile_floats;
        for (int64_t k = 0; k < v.k; ++k) {
          cur[k] = ch[k].e0;
          if (ch[k].e0 == ch[k].e1) {
            std::fill(acc + k * tile_floats, acc + (k + 1) * tile_floats, 0.0f);
          }
        }
        const int64_t row_end = b + 1 < n_blocks ? (b + 1) * rows_per_block : n_ct;
        for (int64_t w1 = b * rows_per_block + window_rows;; w1 += window_rows) {
          // Each offset's edges into rows below w1; the last window takes
          // the rest (all of them where result rows are not sorted).
          const bool last = w1 >= row_end;
          for (int64_t k = 0; k < v.k; ++k) {
            int64_t e = last ? ch[k].e1 : cur[k];
            while (e < ch[k].e1 && (rows_of ? int64_t(rows_of[e]) : e) < w1) {
              ++e;
            }
            end[k] = e;
          }
          for (int64_t k = 0; k < v.k; ++k) {
            if (end[k] == cur[k]) {
              continue;
            }
            int64_t j = k + 1;
            while (j < v.k && end[j] == cur[j]) {
              ++j;
            }
            const int64_t n0 = j < v.k ? cur[j] : 0, n1 = j < v.k ? end[j] : 0;
            gathered_product(
                pf, P, qf, Q, pi, qi, cur[k], end[k], blocks, acc + k * tile_floats, qp,
                cur[k] == ch[k].e0, n0, n1);
            cur[k] = end[k];
          }
          if (last) {
            break;
          }
        }
      }
      return;
    }
    for (int64_t c = c0; c < c1; ++c) {
      float* acc = partial.get() + c * tile_floats;
      if (chunks[c].e0 == chunks[c].e1) {
        std::fill(acc, acc + tile_floats, 0.0f); // no edges of this offset in the block
        continue;
      }
      if (direct) {
        gathered_product(pf, P, qf, Q, pi, qi, chunks[c].e0, chunks[c].e1, blocks, acc, qp);
        continue;
      }
      for (int64_t p = chunks[c].e0; p < chunks[c].e1; p += kPanel) {
        const int64_t n = std::min(kPanel, chunks[c].e1 - p);
        const bool first = p == chunks[c].e0;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t e = p + i;
          const int64_t xg = g ? g[e] : e;
          const int64_t cr = r ? r[e] : e;
          to_float(x + xg * A, (swap ? qpanel : ppanel).data() + i * (swap ? qp : pp), A);
          to_float(ct + cr * B, (swap ? ppanel : qpanel).data() + i * (swap ? pp : qp), B);
        }
        for (auto [col, nv] : blocks) {
          dispatch_vectors(nv, [&]<int NV>() {
            panel_product<NV>(ppanel.data(), pp, qpanel.data(), qp, n, P, col, acc, qp, first);
          });
        }
      }
    }
  });
  // Partial rows (k, p) go to out through its strides: Q elements, which
  // are contiguous when Q's axis is (B in (K, A, B); A, swapped, in the
  // parameter's own (C_out, K, C_in) layout), else Q elements apart by the
  // stride of their axis, whose neighbouring rows fill the same lines.
  const int64_t p_stride = swap ? os.b : os.a, q_stride = swap ? os.a : os.b;
  parallel_for(v.k * P, 64, [&](int64_t i0, int64_t i1) {
    std::vector<float> sum(qp);
    std::vector<T> row(Q);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t k = i / P, p = i % P;
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t b = 0; b < n_blocks; ++b) {
        const float* part = partial.get() + (b * v.k + k) * tile_floats + p * qp;
        for (int q = 0; q < qp; ++q) {
          sum[q] += part[q];
        }
      }
      T* dst = out + k * os.k + p * p_stride;
      if (q_stride == 1) {
        from_float(sum.data(), dst, Q);
      } else {
        from_float(sum.data(), row.data(), Q);
        for (int q = 0; q < Q; ++q) {
          dst[q * q_stride] = row[q];
        }
      }
    }
  });
}

} // namespace

void weight_grad(
    Float t,
    const void* x,
    const void* ct,
    PairView v,
    int64_t n_x,
    int64_t n_ct,
    int A,
    int B,
    WeightStrides os,
    void* out) {
  dispatch_float(t, [&]<typename T>() {
    run<T>(
        static_cast<const T*>(x), static_cast<const T*>(ct), v, n_x, n_ct, A, B, os,
        static_cast<T*>(out));
  });
}

} // namespace mlx_lattice::cpu::LATTICE_ISA

#include "cpu/isa_end.h"
