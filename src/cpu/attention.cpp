// Patch attention CPU kernels: flash-attention tiling with queries along the
// SIMD lanes.
//
// Per (patch, head) the scores are computed transposed, S^T = K Q^T (keys as
// rows, a block of QB queries across the lanes), so the softmax over keys is
// a vertical max / sum of vectors, the key mask is a row count, and the
// products broadcast keys or values against packed query rows (the register
// tile of gather_conv). Keys are visited in blocks of KB with an online
// softmax in base 2 (log2 e folded into the packed queries, so each
// exponential is one 2^x); everything accumulates in float32.
//
// Forward: one task per (patch, head, query block). Backward: one task per
// (patch, head) owns its dK, dV (per key block) and dQ accumulators and
// visits the blocks in a fixed order. No result depends on the thread count.
#include <cmath>

#include "cpu/isa_begin.h"

#include "cpu/pack.h"

namespace mlx_lattice::cpu::LATTICE_ISA {

namespace {

using simd::vec;
typedef int32_t ivec __attribute__((vector_size(simd::kWidth * sizeof(int32_t))));

constexpr int QB = simd::kMaxVectors * simd::kWidth; // queries per block
constexpr int KB = 128;                              // keys per block
constexpr int QV = QB / simd::kWidth;                // vectors per query block

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;

// 2^t for t <= ~0 (scores in the base-2 domain minus a running max or the
// log-sum-exp), exactly zero far below (and for -inf): 2^n * 2^f with
// n = round(t), |f| <= 1/2 and a degree-7 Taylor polynomial of 2^f
// (relative error below 1e-8 before rounding).
inline vec exp2_vec(vec t) {
#if LATTICE_ISA_ID == 2
  t = t < -150.0f ? vec{} - 150.0f : t; // 2^-150 rounds to zero
  const vec r = reinterpret_cast<vec>(_mm512_roundscale_ps(
      reinterpret_cast<__m512>(t), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  t = t < -127.0f ? vec{} - 127.0f : t; // 2^-127 gets a zero exponent field
  const vec r = (t + 12582912.0f) - 12582912.0f; // round to nearest
#endif
  const vec f = t - r;
  vec p = simd::broadcast(1.52527338040598e-05f);
  p = simd::fma(p, f, simd::broadcast(1.54035303933816e-04f));
  p = simd::fma(p, f, simd::broadcast(1.33335581464284e-03f));
  p = simd::fma(p, f, simd::broadcast(9.61812910762848e-03f));
  p = simd::fma(p, f, simd::broadcast(5.55041086648216e-02f));
  p = simd::fma(p, f, simd::broadcast(2.40226506959101e-01f));
  p = simd::fma(p, f, simd::broadcast(6.93147180559945e-01f));
  p = simd::fma(p, f, simd::broadcast(1.0f));
#if LATTICE_ISA_ID == 2
  // p * 2^r in one instruction (r is integral, at least -150).
  return reinterpret_cast<vec>(
      _mm512_scalef_ps(reinterpret_cast<__m512>(p), reinterpret_cast<__m512>(r)));
#else
  const ivec e = (__builtin_convertvector(r, ivec) + 127) << 23;
  vec s;
  static_assert(sizeof(s) == sizeof(e));
  std::memcpy(&s, &e, sizeof(s));
  return p * s;
#endif
}

inline vec vmax(vec a, vec b) {
  return a > b ? a : b;
}

// c[i][:] (+)= sum_t a[i * ars + t * ats] * b[t * ldb + :] for MR rows and
// NV vectors of columns.
template <int MR, int NV, bool ACC>
inline void tile(
    const float* a,
    int64_t ars,
    int64_t ats,
    const float* b,
    int64_t ldb,
    int T,
    float* c,
    int64_t ldc) {
  vec acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      acc[i][j] = ACC ? simd::load(c + i * ldc + j * simd::kWidth) : simd::zero();
    }
  }
  for (int t = 0; t < T; ++t) {
    vec bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      bv[j] = simd::load(b + t * ldb + j * simd::kWidth);
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const vec av = simd::broadcast_load(a + i * ars + t * ats);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) {
        acc[i][j] = simd::fma(av, bv[j], acc[i][j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      simd::store(c + i * ldc + j * simd::kWidth, acc[i][j]);
    }
  }
}

// The last m < rows_for(NV) rows of a product.
template <int NV, bool ACC, int R = 1>
inline void tail_rows(
    int m,
    const float* a,
    int64_t ars,
    int64_t ats,
    const float* b,
    int64_t ldb,
    int T,
    float* c,
    int64_t ldc) {
  if constexpr (R < simd::rows_for(NV)) {
    if (m == R) {
      tile<R, NV, ACC>(a, ars, ats, b, ldb, T, c, ldc);
    } else {
      tail_rows<NV, ACC, R + 1>(m, a, ars, ats, b, ldb, T, c, ldc);
    }
  }
}

// C (M x N) (+)= A (M x T) B (T x N), A strided (ars per row, ats per t),
// N a multiple of the vector width.
template <bool ACC>
void gemm(
    int M,
    int N,
    int T,
    const float* a,
    int64_t ars,
    int64_t ats,
    const float* b,
    int64_t ldb,
    float* c,
    int64_t ldc) {
  constexpr int full = simd::kMaxVectors * simd::kWidth;
  for (int c0 = 0; c0 < N; c0 += full) {
    const int nv = std::min(full, N - c0) / simd::kWidth;
    dispatch_vectors(nv, [&]<int NV>() {
      constexpr int MR = simd::rows_for(NV);
      int r = 0;
      for (; r + MR <= M; r += MR) {
        tile<MR, NV, ACC>(a + r * ars, ars, ats, b + c0, ldb, T, c + r * ldc + c0, ldc);
      }
      if (r < M) {
        tail_rows<NV, ACC>(M - r, a + r * ars, ars, ats, b + c0, ldb, T, c + r * ldc + c0, ldc);
      }
    });
  }
}

struct Dims {
  int64_t bh;  // patches * heads
  int heads;
  int P;       // patch size
  int D;       // head dim
  int Pq;      // P rounded up to QB
  int Dp;      // D rounded up to the vector width
  float scale;
};

inline int valid_len(const int32_t* lengths, int64_t bh, int heads, int P) {
  return std::clamp<int>(lengths[bh / heads], 0, P);
}

// A (patches, heads, P, D) input read through its strides, so that the
// transposed views of a qkv projection are read in place.
template <typename T>
struct Heads {
  const T* p;
  int64_t s[4];
  int heads;

  Heads(StridedView a, int heads) : p(static_cast<const T*>(a.data)), heads(heads) {
    for (int i = 0; i < 4; ++i) {
      s[i] = a.strides[i];
    }
  }
  // Row i of (patch, head) bh as D floats.
  void load(int64_t bh, int i, int D, float* dst) const {
    const T* r = p + (bh / heads) * s[0] + (bh % heads) * s[1] + i * s[2];
    if (s[3] == 1) {
      to_float(r, dst, D);
    } else {
      for (int d = 0; d < D; ++d) {
        dst[d] = static_cast<float>(r[d * s[3]]);
      }
    }
  }
};

// dst (D x Pq) = s * src^T for rows below L, zero elsewhere.
template <typename T>
void pack_transposed(const Heads<T>& src, int64_t bh, int D, int L, int Pq, float s, float* dst, float* row) {
  std::fill(dst, dst + int64_t(D) * Pq, 0.0f);
  for (int i = 0; i < L; ++i) {
    src.load(bh, i, D, row);
    for (int d = 0; d < D; ++d) {
      dst[int64_t(d) * Pq + i] = s * row[d];
    }
  }
}

// dst (L x ld) = s * src rows; columns D..ld zero.
template <typename T>
void pack_rows(const Heads<T>& src, int64_t bh, int D, int L, int ld, float s, float* dst) {
  for (int i = 0; i < L; ++i) {
    float* r = dst + int64_t(i) * ld;
    src.load(bh, i, D, r);
    if (s != 1.0f) {
      for (int d = 0; d < D; ++d) {
        r[d] *= s;
      }
    }
    std::fill(r + D, r + ld, 0.0f);
  }
}

// One query block of one (patch, head): o rows [q0, q0 + QB) and their lse.
void forward_block(
    const Dims& g,
    int L,
    int q0,
    const float* qt,
    const float* kf,
    const float* vf,
    float* s,
    float* ot,
    float* out_rows,
    float* lse) {
  vec m[QV], l[QV];
  for (int j = 0; j < QV; ++j) {
    m[j] = vec{} - INFINITY;
    l[j] = simd::zero();
  }
  std::fill(ot, ot + int64_t(g.D) * QB, 0.0f);
  for (int j0 = 0; j0 < L; j0 += KB) {
    const int kb = std::min(KB, L - j0);
    // S^T (kb x QB) = K Q^T, in the base-2 domain (Q^T holds scale * log2 e).
    gemm<false>(kb, QB, g.D, kf + int64_t(j0) * g.D, g.D, 1, qt + q0, g.Pq, s, QB);
    vec alpha[QV];
    for (int j = 0; j < QV; ++j) {
      vec mx = m[j];
      for (int r = 0; r < kb; ++r) {
        mx = vmax(mx, simd::load(s + r * QB + j * simd::kWidth));
      }
      alpha[j] = exp2_vec(m[j] - mx);
      vec sum = simd::zero();
      for (int r = 0; r < kb; ++r) {
        float* p = s + r * QB + j * simd::kWidth;
        const vec e = exp2_vec(simd::load(p) - mx);
        simd::store(p, e);
        sum += e;
      }
      l[j] = simd::fma(l[j], alpha[j], sum);
      m[j] = mx;
    }
    for (int d = 0; d < g.D; ++d) {
      for (int j = 0; j < QV; ++j) {
        float* p = ot + d * QB + j * simd::kWidth;
        simd::store(p, simd::load(p) * alpha[j]);
      }
    }
    // O^T (D x QB) += V^T P^T.
    gemm<true>(g.D, QB, kb, vf + int64_t(j0) * g.D, 1, g.D, s, QB, ot, QB);
  }
  float mv[QB], lv[QB];
  for (int j = 0; j < QV; ++j) {
    simd::store(mv + j * simd::kWidth, m[j]);
    simd::store(lv + j * simd::kWidth, l[j]);
  }
  const int nq = std::min(QB, L - q0);
  for (int i = 0; i < nq; ++i) {
    const float inv = 1.0f / lv[i];
    for (int d = 0; d < g.D; ++d) {
      out_rows[int64_t(i) * g.D + d] = ot[d * QB + i] * inv;
    }
    lse[i] = (mv[i] + std::log2(lv[i])) * kLn2;
  }
}

template <typename T>
void forward(
    const Heads<T>& q,
    const Heads<T>& k,
    const Heads<T>& v,
    const int32_t* lengths,
    Dims g,
    T* o,
    float* lse) {
  const int64_t per = int64_t(g.P) * g.D;
  // Packed operands per (patch, head): scale * log2 e * Q^T (D x Pq), and
  // the valid rows of K and V as float32 (P x D).
  Scratch qt_buf, k_buf, v_buf;
  float* qt = qt_buf.get(g.bh * g.D * g.Pq);
  float* kf = k_buf.get(g.bh * per);
  float* vf = v_buf.get(g.bh * per);
  parallel_for(g.bh, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> row(g.D);
    for (int64_t bh = b0; bh < b1; ++bh) {
      const int L = valid_len(lengths, bh, g.heads, g.P);
      pack_transposed(q, bh, g.D, L, g.Pq, g.scale * kLog2e, qt + bh * g.D * g.Pq, row.data());
      pack_rows(k, bh, g.D, L, g.D, 1.0f, kf + bh * per);
      pack_rows(v, bh, g.D, L, g.D, 1.0f, vf + bh * per);
    }
  });
  const int nqb = g.Pq / QB;
  parallel_for(g.bh * nqb, 1, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> s, ot, rows;
    s.resize(int64_t(KB) * QB);
    ot.resize(int64_t(g.D) * QB);
    rows.resize(int64_t(QB) * g.D);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t bh = t / nqb;
      const int q0 = static_cast<int>(t % nqb) * QB;
      if (q0 >= g.P) {
        continue;
      }
      const int L = valid_len(lengths, bh, g.heads, g.P);
      const int n = std::min(QB, g.P - q0); // rows of o in this block
      const int nq = std::max(0, std::min(n, L - q0)); // of which valid
      T* orow = o + bh * per + int64_t(q0) * g.D;
      float* lrow = lse + bh * g.P + q0;
      if (nq > 0) {
        forward_block(g, L, q0, qt + bh * g.D * g.Pq, kf + bh * per, vf + bh * per,
                      s.data(), ot.data(), rows.data(), lrow);
        from_float(rows.data(), orow, int64_t(nq) * g.D);
      }
      // Padding queries: zero output and log-sum-exp.
      std::fill(orow + int64_t(nq) * g.D, orow + int64_t(n) * g.D, T(0.0f));
      std::fill(lrow + nq, lrow + n, 0.0f);
    }
  });
}

template <typename T>
void backward(
    const Heads<T>& q,
    const Heads<T>& k,
    const Heads<T>& v,
    const int32_t* lengths,
    const Heads<T>& o,
    const float* lse,
    const Heads<T>& dout,
    const float* dlse,
    Dims g,
    T* dq,
    T* dk,
    T* dv) {
  const int64_t per = int64_t(g.P) * g.D;
  parallel_for(g.bh, 1, [&](int64_t b0, int64_t b1) {
    const int P = g.P, D = g.D, Pq = g.Pq, Dp = g.Dp;
    std::vector<float> qt(int64_t(D) * Pq), qs(int64_t(P) * Dp), kf(per), vf(per);
    std::vector<float> dor(int64_t(P) * Dp), dot(int64_t(D) * Pq), dqt(int64_t(D) * Pq);
    std::vector<float> lv(Pq), delta(Pq), row(D), orow(D);
    std::vector<float> pb(int64_t(KB) * QB), ds(int64_t(KB) * QB);
    std::vector<float> dkb(int64_t(KB) * Dp), dvb(int64_t(KB) * Dp), out(std::max(per, int64_t(1)));
    for (int64_t bh = b0; bh < b1; ++bh) {
      const int L = valid_len(lengths, bh, g.heads, P);
      const int64_t base = bh * per;
      // Operands: Q^T (times scale * log2 e, for the scores), Q rows (times
      // scale, for dK), dO rows, dO^T; per query the log-sum-exp and
      // delta = rowsum(dO * O) - dlse, zero for padding queries (whose dO is
      // zero too, so they contribute nothing).
      pack_transposed(q, bh, D, L, Pq, g.scale * kLog2e, qt.data(), row.data());
      pack_rows(q, bh, D, L, Dp, g.scale, qs.data());
      pack_rows(dout, bh, D, L, Dp, 1.0f, dor.data());
      pack_transposed(dout, bh, D, L, Pq, 1.0f, dot.data(), row.data());
      pack_rows(k, bh, D, L, D, 1.0f, kf.data());
      pack_rows(v, bh, D, L, D, 1.0f, vf.data());
      std::fill(lv.begin(), lv.end(), 0.0f);
      std::fill(delta.begin(), delta.end(), 0.0f);
      for (int i = 0; i < L; ++i) {
        o.load(bh, i, D, orow.data());
        float acc = 0.0f;
        for (int d = 0; d < D; ++d) {
          acc = simd::fma(dor[int64_t(i) * Dp + d], orow[d], acc);
        }
        lv[i] = lse[bh * P + i] * kLog2e;
        delta[i] = acc - dlse[bh * P + i];
      }
      std::fill(dqt.begin(), dqt.end(), 0.0f);
      for (int j0 = 0; j0 < L; j0 += KB) {
        const int kb = std::min(KB, L - j0);
        std::fill(dkb.begin(), dkb.end(), 0.0f);
        std::fill(dvb.begin(), dvb.end(), 0.0f);
        const float* kj = kf.data() + int64_t(j0) * D;
        const float* vj = vf.data() + int64_t(j0) * D;
        for (int q0 = 0; q0 < L; q0 += QB) {
          const int nq = std::min(QB, L - q0);
          // P^T = 2^(K Q^T - lse log2 e): Q^T holds scale * log2 e.
          gemm<false>(kb, QB, D, kj, D, 1, qt.data() + q0, Pq, pb.data(), QB);
          for (int r = 0; r < kb; ++r) {
            for (int j = 0; j < QV; ++j) {
              float* p = pb.data() + r * QB + j * simd::kWidth;
              simd::store(p, exp2_vec(simd::load(p) - simd::load(lv.data() + q0 + j * simd::kWidth)));
            }
          }
          // dV += P^T dO.
          gemm<true>(kb, Dp, nq, pb.data(), QB, 1, dor.data() + int64_t(q0) * Dp, Dp, dvb.data(), Dp);
          // dS^T = P^T * (V dO^T - delta).
          gemm<false>(kb, QB, D, vj, D, 1, dot.data() + q0, Pq, ds.data(), QB);
          for (int r = 0; r < kb; ++r) {
            for (int j = 0; j < QV; ++j) {
              const int c = r * QB + j * simd::kWidth;
              const vec dl = simd::load(delta.data() + q0 + j * simd::kWidth);
              simd::store(ds.data() + c, simd::load(pb.data() + c) * (simd::load(ds.data() + c) - dl));
            }
          }
          // dK += dS^T (scale Q); dQ^T += K^T dS^T.
          gemm<true>(kb, Dp, nq, ds.data(), QB, 1, qs.data() + int64_t(q0) * Dp, Dp, dkb.data(), Dp);
          gemm<true>(D, QB, kb, kj, 1, D, ds.data(), QB, dqt.data() + q0, Pq);
        }
        for (int r = 0; r < kb; ++r) {
          from_float(dkb.data() + int64_t(r) * Dp, dk + base + int64_t(j0 + r) * D, D);
          from_float(dvb.data() + int64_t(r) * Dp, dv + base + int64_t(j0 + r) * D, D);
        }
      }
      for (int i = 0; i < L; ++i) {
        for (int d = 0; d < D; ++d) {
          out[int64_t(i) * D + d] = g.scale * dqt[int64_t(d) * Pq + i];
        }
      }
      from_float(out.data(), dq + base, int64_t(L) * D);
      // Padding rows receive no gradient.
      std::fill(dq + base + int64_t(L) * D, dq + base + per, T(0.0f));
      std::fill(dk + base + int64_t(L) * D, dk + base + per, T(0.0f));
      std::fill(dv + base + int64_t(L) * D, dv + base + per, T(0.0f));
    }
  });
}

Dims dims_of(const AttentionShape& a) {
  Dims g;
  g.heads = a.heads;
  g.bh = a.patches * a.heads;
  g.P = a.P;
  g.D = a.D;
  g.Pq = static_cast<int>(round_up(std::max(g.P, 1), QB));
  g.Dp = static_cast<int>(round_up(g.D, simd::kWidth));
  g.scale = a.scale;
  return g;
}

} // namespace

void attention_forward(
    Float t,
    AttentionShape a,
    StridedView q,
    StridedView k,
    StridedView v,
    const int32_t* lengths,
    void* o,
    float* lse) {
  const Dims g = dims_of(a);
  dispatch_float(t, [&]<typename T>() {
    forward<T>(Heads<T>(q, a.heads), Heads<T>(k, a.heads), Heads<T>(v, a.heads),
               lengths, g, static_cast<T*>(o), lse);
  });
}

void attention_backward(
    Float t,
    AttentionShape a,
    StridedView q,
    StridedView k,
    StridedView v,
    const int32_t* lengths,
    StridedView o,
    const float* lse,
    StridedView dout,
    const float* dlse,
    void* dq,
    void* dk,
    void* dv) {
  const Dims g = dims_of(a);
  dispatch_float(t, [&]<typename T>() {
    backward<T>(Heads<T>(q, a.heads), Heads<T>(k, a.heads), Heads<T>(v, a.heads),
                lengths, Heads<T>(o, a.heads), lse, Heads<T>(dout, a.heads), dlse, g,
                static_cast<T*>(dq), static_cast<T*>(dk), static_cast<T*>(dv));
  });
}

} // namespace mlx_lattice::cpu::LATTICE_ISA

#include "cpu/isa_end.h"
