// Fused normalisation + activation kernels (the NormAct / NormActGrad
// primitives of src/norm.cpp), compiled per instruction-set path: the row
// loops vectorize for the path, and half rows convert with F16C on AVX2 /
// AVX-512 (cpu/convert.h).
//
// The activation is y = z > 0 ? z : low * z with low >= 0, so the sign of y
// is the sign of z and the backward pass reads act' from y. Written without
// branches (signs of ReLU inputs are random: branches mispredict).
#include <cmath>

#include "cpu/isa_begin.h"

#include "cpu/convert.h"
#include "cpu/simd.h"

namespace mlx_lattice::cpu::LATTICE_ISA {

namespace {

// Rows per reduction chunk: fixed, so the summation order (float32 within a
// chunk, float64 across chunks in chunk order) never depends on threads.
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

// Chunk partials: fn(first row, end row, the chunk's accumulators).
template <typename F>
void chunk_sums(
    int64_t N,
    int64_t width,
    std::vector<float>& part,
    const F& fn) {
  int64_t chunks = n_chunks(N);
  part.assign(chunks * width, 0.0f);
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
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
    auto n = segment_counts(seg, S, N);
    std::vector<float> part;
    std::vector<double> acc;
    chunk_sums(N, S * C, part, [&](int64_t i0, int64_t i1, float* p) {
      std::vector<float> bv(C);
      float* __restrict buf = bv.data();
      for (int64_t i = i0; i < i1; ++i) {
        float* __restrict q = p + seg_of(seg, i) * C;
        to_float(x + i * C, buf, C);
        lanes(C, [&]<typename V>(int64_t c) { st(q + c, ld<V>(q + c) + ld<V>(buf + c)); });
      }
    });
    combine(part, n_chunks(N), S * C, acc);
    for (int s = 0; s < S; ++s) {
      for (int64_t c = 0; c < C; ++c) {
        mean[s * C + c] = n[s] > 0 ? static_cast<float>(acc[s * C + c] / n[s]) : 0.0f;
      }
    }
    chunk_sums(N, S * C, part, [&](int64_t i0, int64_t i1, float* p) {
      std::vector<float> bv(C);
      float* __restrict buf = bv.data();
      for (int64_t i = i0; i < i1; ++i) {
        int s = seg_of(seg, i);
        float* __restrict q = p + s * C;
        const float* __restrict mu = mean.data() + s * C;
        to_float(x + i * C, buf, C);
        lanes(C, [&]<typename V>(int64_t c) {
          const V d = ld<V>(buf + c) - ld<V>(mu + c);
          st(q + c, ld<V>(q + c) + d * d);
        });
      }
    });
    combine(part, n_chunks(N), S * C, acc);
    for (int s = 0; s < S; ++s) {
      for (int64_t c = 0; c < C; ++c) {
        var[s * C + c] = n[s] > 0 ? static_cast<float>(acc[s * C + c] / n[s]) : 0.0f;
      }
    }
    std::copy(mean.begin(), mean.end(), mean_out);
    std::copy(var.begin(), var.end(), var_out);
  } else {
    std::copy(mean_in, mean_in + S * C, mean.begin());
    std::copy(var_in, var_in + S * C, var.begin());
  }
  // y = act(x * scale + shift [+ r]) with scale = w / sqrt(var + eps).
  std::vector<float> scale(S * C), shift(S * C);
  for (int s = 0; s < S; ++s) {
    for (int64_t c = 0; c < C; ++c) {
      float inv = 1.0f / std::sqrt(var[s * C + c] + sp.eps);
      scale[s * C + c] = w[c] * inv;
      shift[s * C + c] = b[c] - mean[s * C + c] * w[c] * inv;
    }
  }
  const float lo = sp.low;
  parallel_for(N, kRows, [&](int64_t i0, int64_t i1) {
    std::vector<float> bv(C), rv(C, 0.0f);
    float* __restrict buf = bv.data();
    float* __restrict rb = rv.data();
    const float low = lo;
    for (int64_t i = i0; i < i1; ++i) {
      int s = seg_of(seg, i);
      const float* __restrict sc = scale.data() + s * C;
      const float* __restrict sh = shift.data() + s * C;
      to_float(x + i * C, buf, C);
      if (r) {
        to_float(r + i * C, rb, C);
      }
      lanes(C, [&]<typename V>(int64_t c) {
        const V z = ld<V>(buf + c) * ld<V>(sc + c) + ld<V>(sh + c) + ld<V>(rb + c);
        st(buf + c, z > 0.0f ? z : low * z);
      });
      from_float(buf, y + i * C, C);
    }
  });
}

template <typename T>
void normalize_grad(
    NormShape sp,
    const T* x,
    const T* y,
    const T* ct,
    const float* w,
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
  const int S = sp.segments;
  const float lo = sp.low;
  std::vector<float> inv(S * C);
  for (int64_t j = 0; j < S * C; ++j) {
    inv[j] = 1.0f / std::sqrt(var[j] + sp.eps);
  }
  // g = ct * act'(y); per segment A = sum g, B = sum g * xhat.
  std::vector<float> part;
  std::vector<double> acc;
  chunk_sums(N, 2 * S * C, part, [&](int64_t i0, int64_t i1, float* p) {
    std::vector<float> xv(C), yv(C), cv(C);
    float* __restrict xb = xv.data();
    float* __restrict yb = yv.data();
    float* __restrict cb = cv.data();
    const float low = lo;
    for (int64_t i = i0; i < i1; ++i) {
      int s = seg_of(seg, i);
      to_float(x + i * C, xb, C);
      to_float(y + i * C, yb, C);
      to_float(ct + i * C, cb, C);
      const float* __restrict mu = mean + s * C;
      const float* __restrict iv = inv.data() + s * C;
      float* __restrict pa = p + s * C;
      float* __restrict pb = p + (S + s) * C;
      lanes(C, [&]<typename V>(int64_t c) {
        const V ctv = ld<V>(cb + c);
        const V g = ld<V>(yb + c) > 0.0f ? ctv : low * ctv;
        st(pa + c, ld<V>(pa + c) + g);
        st(pb + c, ld<V>(pb + c) + g * ((ld<V>(xb + c) - ld<V>(mu + c)) * ld<V>(iv + c)));
      });
    }
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
  // dx = w inv (g - A/n - xhat B/n) + ct_mean/n + 2 ct_var (x - mean)/n
  // (training); dx = w inv g (eval).
  std::vector<float> k0(S * C), k1(S * C), k2(S * C), k3(S * C), k4(S * C);
  auto n = segment_counts(seg, S, N);
  for (int s = 0; s < S; ++s) {
    double rn = n[s] > 0 ? 1.0 / n[s] : 0.0;
    for (int64_t c = 0; c < C; ++c) {
      int64_t j = s * C + c;
      k0[j] = w[c] * inv[j];
      if (sp.training) {
        k1[j] = static_cast<float>(acc[j] * rn);            // A / n
        k2[j] = static_cast<float>(acc[S * C + j] * rn);    // B / n
        k3[j] = static_cast<float>(ct_var[j] * 2.0 * rn);   // 2 ct_var / n
        k4[j] = static_cast<float>(ct_mean[j] * rn);        // ct_mean / n
      }
    }
  }
  parallel_for(N, kRows, [&](int64_t i0, int64_t i1) {
    std::vector<float> xv(C), yv(C), cv(C), gv(C);
    float* __restrict xb = xv.data();
    float* __restrict yb = yv.data();
    float* __restrict cb = cv.data();
    float* __restrict gb = gv.data();
    const float low = lo;
    for (int64_t i = i0; i < i1; ++i) {
      int s = seg_of(seg, i);
      to_float(x + i * C, xb, C);
      to_float(y + i * C, yb, C);
      to_float(ct + i * C, cb, C);
      const float* __restrict f0 = k0.data() + s * C;
      lanes(C, [&]<typename V>(int64_t c) {
        const V ctv = ld<V>(cb + c);
        st(gb + c, ld<V>(yb + c) > 0.0f ? ctv : low * ctv);
      });
      if (g_out) {
        from_float(gb, g_out + i * C, C);
      }
      if (sp.training) {
        const float* __restrict mu = mean + s * C;
        const float* __restrict iv = inv.data() + s * C;
        const float* __restrict f1 = k1.data() + s * C;
        const float* __restrict f2 = k2.data() + s * C;
        const float* __restrict f3 = k3.data() + s * C;
        const float* __restrict f4 = k4.data() + s * C;
        lanes(C, [&]<typename V>(int64_t c) {
          const V d = ld<V>(xb + c) - ld<V>(mu + c);
          st(gb + c, ld<V>(f0 + c) * (ld<V>(gb + c) - ld<V>(f1 + c) - d * ld<V>(iv + c) * ld<V>(f2 + c)) +
                         ld<V>(f3 + c) * d + ld<V>(f4 + c));
        });
      } else {
        lanes(C, [&]<typename V>(int64_t c) { st(gb + c, ld<V>(gb + c) * ld<V>(f0 + c)); });
      }
      from_float(gb, dx + i * C, C);
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
    normalize_grad<T>(n, static_cast<const T*>(x), static_cast<const T*>(y),
                static_cast<const T*>(ct), w, mean, var, seg, ct_mean, ct_var,
                static_cast<T*>(dx), dw, db, static_cast<T*>(g_out));
  });
}

} // namespace mlx_lattice::cpu::LATTICE_ISA

#include "cpu/isa_end.h"
