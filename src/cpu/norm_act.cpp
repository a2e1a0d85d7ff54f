// Fused normalisation + activation kernels (the NormAct / NormActGrad
// primitives of src/core/norm.cpp), compiled per instruction-set path: the row
// loops vectorize for the path, and half rows convert with F16C on AVX2 /
// AVX-512 (cpu/convert.h).
//
// The activation is y = z > 0 ? z : low * z with low >= 0, so the sign of y
// is the sign of z: the backward pass takes act' from z recomputed from x
// (or from y when a residual was added). Written without branches (signs of
// ReLU inputs are random: branches mispredict).
//
// Passes over memory: forward, one statistics sweep and one normalising
// sweep; backward, one sweep for the per-channel sums and one for dx. The
// first sweep of each runs last row chunk to first, the second first to
// last, so each starts where the data last touched is still in cache.
#include <cmath>

#include "cpu/isa_begin.h"

#include "cpu/convert.h"
#include "cpu/simd.h"

namespace mlx_lattice::cpu::LATTICE_ISA {

namespace {

// Rows per reduction chunk: fixed, so the summation order (float32 within a
// chunk, float64 across chunks in chunk order) never depends on threads.
// A chunk of up to 256 channels stays in L2 for a second in-cache sweep.
constexpr int64_t kRows = 256;

int64_t n_chunks(int64_t n) {
  return (n + kRows - 1) / kRows;
}

inline int seg_of(const int32_t* seg, int64_t i) {
  return seg ? seg[i] : 0;
}

// Per-segment row counts (segment ids are checked by the caller).
std::vector<double> segment_counts(const int32_t* seg, int S, int64_t N) {
  std::vector<double> n(S, 0.0);
  if (!seg) {
    n[0] = static_cast<double>(N);
    return n;
  }
  for (int64_t i = 0; i < N; ++i) {
    n[seg[i]] += 1.0;
  }
  return n;
}

// acc[s, c] = sum over chunks (in order) of the chunk partials.
void combine(
    const std::vector<float>& part,
    int64_t chunks,
    int64_t width,
    std::vector<double>& acc) {
  acc.assign(width, 0.0);
  for (int64_t c = 0; c < chunks; ++c) {
    const float* p = part.data() + c * width;
    for (int64_t j = 0; j < width; ++j) {
      acc[j] += p[j];
    }
  }
}

// Row vectors: the path's SIMD width, but 8 floats on AVX-512 too. The rows
// are memory-bound, and the half and bfloat16 rows widen 8 floats per store:
// a 512-bit load of two 256-bit stores is not forwarded and stalls.
#if LATTICE_ISA_ID == 2
constexpr int kLanes = 8;
#else
constexpr int kLanes = simd::kWidth;
#endif
typedef float rvec __attribute__((vector_size(kLanes * sizeof(float))));

// Elementwise steps over a row of C channels: f.template operator()<V>(c)
// on whole row vectors (V = rvec), then on single floats (V = float), read
// and written through ld<V> and st. The same expression serves both, and
// on vectors selects such as the activation are blends, never branches.
template <typename F>
inline void lanes(int64_t C, F&& f) {
  int64_t c = 0;
  for (; c + kLanes <= C; c += kLanes) {
    f.template operator()<rvec>(c);
  }
  for (; c < C; ++c) {
    f.template operator()<float>(c);
  }
}

template <typename V>
inline V ld(const float* p) {
  if constexpr (std::is_same_v<V, float>) {
    return *p;
  } else {
    rvec v;
    std::memcpy(&v, p, sizeof(rvec));
    return v;
  }
}

inline void st(float* p, float v) {
  *p = v;
}

inline void st(float* p, rvec v) {
  std::memcpy(p, &v, sizeof(rvec));
}

// Row i of x as float32: in place for float32 rows, else widened into buf.
template <typename T>
inline const float* row_in(const T* x, int64_t i, int64_t C, float* buf, int64_t ld = 0) {
  const T* row = x + i * (ld ? ld : C);
  if constexpr (std::is_same_v<T, float>) {
    return row;
  } else {
    to_float(row, buf, C);
    return buf;
  }
}

// Where row i of y is computed: in place for float32, else in buf (then
// narrowed by the caller).
template <typename T>
inline float* row_out(T* y, int64_t i, int64_t C, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    return y + i * C;
  } else {
    return buf;
  }
}

// z = (x - mean) * scale + b + r with scale = w / sqrt(var + eps): one
// expression for the forward pass and for the backward pass, which
// recomputes z's sign rather than reading y. Centring first keeps z
// accurate when the mean is large against the spread (folding the mean
// into a shift b - mean * scale cancels catastrophically there).
inline void affine_rows(
    const NormShape& sp,
    const float* w,
    const float* b,
    const float* var,
    std::vector<float>& scale,
    std::vector<float>& bias) {
  const int64_t SC = int64_t(sp.segments) * sp.C;
  scale.resize(SC);
  bias.resize(SC);
  for (int64_t j = 0; j < SC; ++j) {
    const int64_t c = j % sp.C;
    scale[j] = w[c] * (1.0f / std::sqrt(var[j] + sp.eps));
    bias[j] = b[c];
  }
}

template <typename V, bool R>
inline V pre_activation(
    const float* x,
    const float* mu,
    const float* sc,
    const float* bb,
    const float* r,
    int64_t c) {
  const V z = simd::fma(ld<V>(x + c) - ld<V>(mu + c), ld<V>(sc + c), ld<V>(bb + c));
  if constexpr (R) {
    return z + ld<V>(r + c);
  } else {
    return z;
  }
}

// A chunk's float32 mean from its shift x0 and the sum of x - x0 (the
// centre of its sum of squares).
inline float chunk_mean(float x0, float sum, float count) {
  return count > 0.0f ? x0 + sum / count : 0.0f;
}

// Rows [i0, i1) of x as float32 (row i at the result + (i - i0) * C): in
// place for float32, else widened into buf.
template <typename T>
inline const float* chunk_in(const T* x, int64_t i0, int64_t i1, int64_t C, std::vector<float>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    return x + i0 * C;
  } else {
    buf.resize((i1 - i0) * C);
    to_float(x + i0 * C, buf.data(), (i1 - i0) * C);
    return buf.data();
  }
}

// The same for rows ld elements apart: float32 rows are read in place
// (stride ld, set in *stride), others widened into buf (stride C).
template <typename T>
inline const float* chunk_in(
    const T* x, int64_t ld, int64_t i0, int64_t i1, int64_t C, std::vector<float>& buf,
    int64_t* stride) {
  if constexpr (std::is_same_v<T, float>) {
    *stride = ld;
    return x + i0 * ld;
  } else {
    *stride = C;
    buf.resize((i1 - i0) * C);
    for (int64_t i = i0; i < i1; ++i) {
      to_float(x + i * ld, buf.data() + (i - i0) * C, C);
    }
    return buf.data();
  }
}

// Calls fn(first row, end row, segment) on the runs of equal segment ids
// in [i0, i1) (one run without ids; rows of a batch item are usually
// contiguous).
template <typename F>
inline void segment_runs(const int32_t* seg, int64_t i0, int64_t i1, F&& fn) {
  int64_t a = i0;
  while (a < i1) {
    int64_t b = a + 1;
    const int s = seg_of(seg, a);
    while (seg && b < i1 && seg[b] == s) {
      ++b;
    }
    if (!seg) {
      b = i1;
    }
    fn(a, b, s);
    a = b;
  }
}

// out[k][c] += sum over rows r in [0, n) of term k of f(r, c), for NT terms
// and the NV column vectors from column c0: the rows stream through once,
// NV vectors wide, and the sums stay in registers (rows in order: a fixed
// summation order). f.template operator()<V>(r, c, t) fills t[0..NT).
template <int NT, int NV, typename F>
inline void panel_sums(int64_t n, int64_t c0, float* const (&out)[NT], F& f) {
  rvec a[NT][NV], t[NT];
  for (int k = 0; k < NT; ++k) {
    for (int v = 0; v < NV; ++v) {
      a[k][v] = rvec{};
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    for (int v = 0; v < NV; ++v) {
      f.template operator()<rvec>(r, c0 + v * kLanes, t);
      for (int k = 0; k < NT; ++k) {
        a[k][v] += t[k];
      }
    }
  }
  for (int k = 0; k < NT; ++k) {
    for (int v = 0; v < NV; ++v) {
      float* o = out[k] + c0 + v * kLanes;
      st(o, ld<rvec>(o) + a[k][v]);
    }
  }
}

// panel_sums over all C columns: panels of up to four vectors (the
// accumulators fit the 16 vector registers of every path), then single
// columns.
template <int NT, typename F>
inline void column_sums(int64_t n, int64_t C, float* const (&out)[NT], F&& f) {
  constexpr int kPanel = 4;
  int64_t c = 0;
  for (; c + kPanel * kLanes <= C; c += kPanel * kLanes) {
    panel_sums<NT, kPanel>(n, c, out, f);
  }
  switch ((C - c) / kLanes) {
    case 3:
      panel_sums<NT, 3>(n, c, out, f);
      c += 3 * kLanes;
      break;
    case 2:
      panel_sums<NT, 2>(n, c, out, f);
      c += 2 * kLanes;
      break;
    case 1:
      panel_sums<NT, 1>(n, c, out, f);
      c += kLanes;
      break;
    default:
      break;
  }
  for (; c < C; ++c) {
    float a[NT] = {}, t[NT];
    for (int64_t r = 0; r < n; ++r) {
      f.template operator()<float>(r, c, t);
      for (int k = 0; k < NT; ++k) {
        a[k] += t[k];
      }
    }
    for (int k = 0; k < NT; ++k) {
      out[k][c] += a[k];
    }
  }
}

// Chunk partials: fn(first row, end row, the chunk's accumulators). The
// chunks are visited last to first: the rows a producer wrote last are the
// ones still in cache, and the sweep after this one (first to last) starts
// on the rows this one read last. Each chunk keeps its own slot, so the
// partials and their combination do not depend on the visiting order.
template <typename F>
void chunk_sums(
    int64_t N,
    int64_t width,
    std::vector<float>& part,
    const F& fn) {
  int64_t chunks = n_chunks(N);
  part.assign(chunks * width, 0.0f);
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t k = c0; k < c1; ++k) {
      const int64_t c = chunks - 1 - k;
      fn(c * kRows, std::min(N, (c + 1) * kRows), part.data() + c * width);
    }
  });
}

template <typename T>
void normalize(
    NormShape sp,
    const T* x,
    const float* w,
    const float* b,
    const T* r,
    const int32_t* seg,
    const float* mean_in,
    const float* var_in,
    float* mean_out,
    float* var_out,
    T* y) {
  const int64_t N = sp.N, C = sp.C;
  const int S = sp.segments;
  std::vector<float> mean(S * C), var(S * C);
  if (sp.training) {
    // One sweep over memory. Per chunk and segment: the row count, the sum
    // of x - x0 (x0: the segment's first row in the chunk, so the float32
    // sum carries no large offset), and the sum of squares about the chunk's
    // float32 mean (a second sweep over the chunk's rows while they are in
    // cache). Chunks combine in chunk order in float64 with the pairwise
    // update of Chan, Golub and LeVeque: centred throughout, so the variance
    // stays exact where mean^2 >> var, and the order never depends on threads.
    std::vector<float> part;
    const int64_t SC = int64_t(S) * C;
    const int64_t width = 3 * SC + S;  // sums, squares, shifts x0, counts
    chunk_sums(N, width, part, [&](int64_t i0, int64_t i1, float* p) {
      std::vector<float> xbuf, mv(SC);
      const float* xs = chunk_in(x, i0, i1, C, xbuf);
      float* x0 = p + 2 * SC;
      float* cnt = p + 3 * SC;
      segment_runs(seg, i0, i1, [&](int64_t a, int64_t b, int s) {
        const float* __restrict xr = xs + (a - i0) * C;
        if (cnt[s] == 0.0f) {
          std::copy(xr, xr + C, x0 + s * C);
        }
        cnt[s] += static_cast<float>(b - a);
        const float* __restrict sh = x0 + s * C;
        float* const q[1] = {p + s * C};
        column_sums<1>(b - a, C, q, [&]<typename V>(int64_t r, int64_t c, V* t) {
          t[0] = ld<V>(xr + r * C + c) - ld<V>(sh + c);
        });
      });
      for (int64_t j = 0; j < SC; ++j) {
        mv[j] = chunk_mean(x0[j], p[j], cnt[j / C]);
      }
      segment_runs(seg, i0, i1, [&](int64_t a, int64_t b, int s) {
        const float* __restrict xr = xs + (a - i0) * C;
        const float* __restrict mu = mv.data() + s * C;
        float* const q[1] = {p + SC + s * C};
        column_sums<1>(b - a, C, q, [&]<typename V>(int64_t r, int64_t c, V* t) {
          const V d = ld<V>(xr + r * C + c) - ld<V>(mu + c);
          t[0] = d * d;
        });
      });
    });
    std::vector<double> na(S, 0.0), ma(SC, 0.0), m2(SC, 0.0);
    for (int64_t k = 0; k < n_chunks(N); ++k) {
      const float* p = part.data() + k * width;
      for (int s = 0; s < S; ++s) {
        const float cnt = p[3 * SC + s];
        const double nb = cnt;
        if (nb == 0.0) {
          continue;
        }
        const double n = na[s] + nb;
        for (int64_t c = 0; c < C; ++c) {
          const int64_t j = s * C + c;
          const double mb = double(p[2 * SC + j]) + p[j] / nb;
          // squares about mb rather than the float32 centre of the sweep
          const double off = mb - chunk_mean(p[2 * SC + j], p[j], cnt);
          const double m2b = p[SC + j] - nb * off * off;
          const double delta = mb - ma[j];
          ma[j] += delta * (nb / n);
          m2[j] += m2b + delta * delta * (na[s] * nb / n);
        }
        na[s] = n;
      }
    }
    for (int s = 0; s < S; ++s) {
      for (int64_t c = 0; c < C; ++c) {
        const int64_t j = s * C + c;
        mean[j] = na[s] > 0 ? static_cast<float>(ma[j]) : 0.0f;
        var[j] = na[s] > 0 ? static_cast<float>(std::max(m2[j], 0.0) / na[s]) : 0.0f;
      }
    }
    std::copy(mean.begin(), mean.end(), mean_out);
    std::copy(var.begin(), var.end(), var_out);
  } else {
    std::copy(mean_in, mean_in + S * C, mean.begin());
    std::copy(var_in, var_in + S * C, var.begin());
  }
  std::vector<float> scale, bias;
  affine_rows(sp, w, b, var.data(), scale, bias);
  const float lo = sp.low;
  auto pass = [&]<bool R>() {
    parallel_for(N, kRows, [&](int64_t i0, int64_t i1) {
      std::vector<float> bv(C), rv(C);
      float* __restrict buf = bv.data();
      const float low = lo;
      for (int64_t i = i0; i < i1; ++i) {
        int s = seg_of(seg, i);
        const float* __restrict sc = scale.data() + s * C;
        const float* __restrict bb = bias.data() + s * C;
        const float* __restrict mu = mean.data() + s * C;
        const float* xr = row_in(x, i, C, buf);
        const float* rr = R ? row_in(r, i, C, rv.data()) : nullptr;
        float* out = row_out(y, i, C, buf);
        lanes(C, [&]<typename V>(int64_t c) {
          const V z = pre_activation<V, R>(xr, mu, sc, bb, rr, c);
          st(out + c, z > 0.0f ? z : low * z);
        });
        if constexpr (!std::is_same_v<T, float>) {
          from_float(buf, y + i * C, C);
        }
      }
    });
  };
  if (r) {
    pass.template operator()<true>();
  } else {
    pass.template operator()<false>();
  }
}

// The backward pass. g = ct * act'(z): without a residual z's sign is
// recomputed from x exactly as the forward pass computed z, so y is never
// read; with one (not an input here) it is read from y, whose sign is z's.
template <typename T, bool FromX>
void normalize_grad(
    NormShape sp,
    const T* x,
    const T* y,
    const T* ct,
    const float* w,
    const float* b,
    const float* mean,
    const float* var,
    const int32_t* seg,
    const float* ct_mean,
    const float* ct_var,
    T* dx,
    float* dw,
    float* db,
    T* g_out) {
  const int64_t N = sp.N, C = sp.C;
  const int64_t ldc = sp.ct_ld ? sp.ct_ld : C;
  const int S = sp.segments;
  const float lo = sp.low;
  std::vector<float> inv(S * C);
  for (int64_t j = 0; j < S * C; ++j) {
    inv[j] = 1.0f / std::sqrt(var[j] + sp.eps);
  }
  std::vector<float> scale, bias;
  affine_rows(sp, w, b, var, scale, bias);
  // g at rows x, y, ct (float32 row pointers; y unused when FromX).
  auto gate = [low = lo]<typename V>(
                  const float* xr, const float* yr, const float* cr, const float* mu,
                  const float* sc, const float* bb, int64_t c) {
    const V ctv = ld<V>(cr + c);
    V z;
    if constexpr (FromX) {
      z = pre_activation<V, false>(xr, mu, sc, bb, nullptr, c);
    } else {
      z = ld<V>(yr + c);
    }
    return z > 0.0f ? ctv : low * ctv;
  };
  // With a residual and float32 rows, the sums sweep also stores g (the
  // residual's gradient) and the dx sweep reads it back in place of y and
  // ct: one array pass fewer, the same values.
  constexpr bool kKeepG = !FromX && std::is_same_v<T, float>;
  // Per segment A = sum g, B = sum g * xhat.
  std::vector<float> part;
  std::vector<double> acc;
  chunk_sums(N, 2 * S * C, part, [&](int64_t i0, int64_t i1, float* p) {
    std::vector<float> xbuf, ybuf, cbuf;
    const float* xs = chunk_in(x, i0, i1, C, xbuf);
    int64_t cst = C;
    const float* cs = chunk_in(ct, ldc, i0, i1, C, cbuf, &cst);
    const float* ys = FromX ? nullptr : chunk_in(y, i0, i1, C, ybuf);
    segment_runs(seg, i0, i1, [&](int64_t a, int64_t b, int s) {
      const float* __restrict xr = xs + (a - i0) * C;
      const float* __restrict cr = cs + (a - i0) * cst;
      const float* __restrict yr = FromX ? nullptr : ys + (a - i0) * C;
      const float* __restrict mu = mean + s * C;
      const float* __restrict iv = inv.data() + s * C;
      const float* __restrict sc = scale.data() + s * C;
      const float* __restrict bb = bias.data() + s * C;
      float* const q[2] = {p + s * C, p + (S + s) * C};
      column_sums<2>(b - a, C, q, [&]<typename V>(int64_t r, int64_t c, V* t) {
        const int64_t o = r * C;
        const V g = gate.template operator()<V>(xr + o, FromX ? nullptr : yr + o, cr + r * cst, mu, sc, bb, c);
        if constexpr (kKeepG) {
          st(reinterpret_cast<float*>(g_out) + (a + r) * C + c, g);
        }
        t[0] = g;
        t[1] = g * ((ld<V>(xr + o + c) - ld<V>(mu + c)) * ld<V>(iv + c));
      });
    });
  });
  combine(part, n_chunks(N), 2 * S * C, acc);
  for (int64_t c = 0; c < C; ++c) {
    double sa = 0.0, sb = 0.0;
    for (int s = 0; s < S; ++s) {
      sa += acc[s * C + c];
      sb += acc[(S + s) * C + c];
    }
    db[c] = static_cast<float>(sa);
    dw[c] = static_cast<float>(sb);
  }
  // Training: dx = w inv (g - A/n - d inv B/n) + ct_mean/n + 2 ct_var d/n
  // with d = x - mean, as dx = k0 g + k1 d + k2 (coefficients in float64);
  // eval: dx = k0 g with k0 = w inv.
  std::vector<float> k0(S * C), k1(S * C, 0.0f), k2(S * C, 0.0f);
  auto n = segment_counts(seg, S, N);
  for (int s = 0; s < S; ++s) {
    double rn = n[s] > 0 ? 1.0 / n[s] : 0.0;
    for (int64_t c = 0; c < C; ++c) {
      int64_t j = s * C + c;
      const double wi = double(w[c]) * inv[j];
      k0[j] = w[c] * inv[j];
      if (sp.training) {
        // statistics without gradient (no cotangents given): zero, in the
        // same expressions
        const double cv = ct_var ? double(ct_var[j]) : 0.0;
        const double cm = ct_mean ? double(ct_mean[j]) : 0.0;
        k1[j] = static_cast<float>(2.0 * cv * rn - wi * inv[j] * acc[S * C + j] * rn);
        k2[j] = static_cast<float>(cm * rn - wi * acc[j] * rn);
      }
    }
  }
  const bool training = sp.training;
  parallel_for(N, kRows, [&](int64_t i0, int64_t i1) {
    std::vector<float> xv(C), yv(C), cv(C), gv(C), dv(C);
    float* __restrict gb = gv.data();
    for (int64_t i = i0; i < i1; ++i) {
      int s = seg_of(seg, i);
      const float* __restrict xr = row_in(x, i, C, xv.data());
      const float* __restrict cr = kKeepG ? nullptr : row_in(ct, i, C, cv.data(), ldc);
      const float* __restrict yr = FromX || kKeepG ? nullptr : row_in(y, i, C, yv.data());
      const float* __restrict sc = scale.data() + s * C;
      const float* __restrict bb = bias.data() + s * C;
      const float* __restrict f0 = k0.data() + s * C;
      const float* __restrict f1 = k1.data() + s * C;
      const float* __restrict f2 = k2.data() + s * C;
      const float* __restrict mu = mean + s * C;
      float* __restrict go = g_out ? row_out(g_out, i, C, gb) : gb;
      float* __restrict out = row_out(dx, i, C, dv.data());
      lanes(C, [&]<typename V>(int64_t c) {
        V g;
        if constexpr (kKeepG) {
          g = ld<V>(go + c);
        } else {
          g = gate.template operator()<V>(xr, yr, cr, mu, sc, bb, c);
          if constexpr (!FromX) {
            st(go + c, g);
          }
        }
        if (training) {
          const V d = ld<V>(xr + c) - ld<V>(mu + c);
          st(out + c, simd::fma(ld<V>(f0 + c), g, simd::fma(ld<V>(f1 + c), d, ld<V>(f2 + c))));
        } else {
          st(out + c, ld<V>(f0 + c) * g);
        }
      });
      if constexpr (!std::is_same_v<T, float>) {
        if (g_out) {
          from_float(gb, g_out + i * C, C);
        }
        from_float(dv.data(), dx + i * C, C);
      }
    }
  });
}

} // namespace

void norm_forward(
    Float t,
    NormShape n,
    const void* x,
    const float* w,
    const float* b,
    const void* r,
    const int32_t* seg,
    const float* mean_in,
    const float* var_in,
    float* mean_out,
    float* var_out,
    void* y) {
  dispatch_float(t, [&]<typename T>() {
    normalize<T>(n, static_cast<const T*>(x), w, b, static_cast<const T*>(r), seg, mean_in,
               var_in, mean_out, var_out, static_cast<T*>(y));
  });
}

void norm_backward(
    Float t,
    NormShape n,
    const void* x,
    const void* y,
    const void* ct,
    const float* w,
    const float* b,
    const float* mean,
    const float* var,
    const int32_t* seg,
    const float* ct_mean,
    const float* ct_var,
    void* dx,
    float* dw,
    float* db,
    void* g_out) {
  dispatch_float(t, [&]<typename T>() {
    (g_out ? normalize_grad<T, false> : normalize_grad<T, true>)(n, static_cast<const T*>(x), static_cast<const T*>(y),
                static_cast<const T*>(ct), w, b, mean, var, seg, ct_mean, ct_var,
                static_cast<T*>(dx), dw, db, static_cast<T*>(g_out));
  });
}

} // namespace mlx_lattice::cpu::LATTICE_ISA

#include "cpu/isa_end.h"
