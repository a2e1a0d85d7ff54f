// Grouped and depthwise CPU kernels. The weight of a grouped product is
// (K, A / G, B): output channel c reads the input channels of its group,
// [(c / (B / G)) * (A / G), ...), through column c of W[k].
//
// Groups of at least one SIMD vector of outputs keep a register tile of
// output channels while their Ag inputs are broadcast against rows of W[k]
// (a small GEMM per group). Narrower groups (depthwise) run, per input
// channel a of a group, one elementwise multiply-add across all B outputs:
// acc[c] += xs[c] * W[k][a, c] with xs[c] = x[(c / Bg) * Ag + a] (the row
// itself when depthwise with multiplier 1). Each output row (or weight-gradient chunk) is summed by one
// task in edge order, so results do not depend on the thread count.
#include "cpu/isa_begin.h"

#include "cpu/convert.h"
#include "cpu/simd.h"

namespace mlx_lattice::cpu::LATTICE_ISA {

namespace {

using simd::vec;

// acc[0:n] += a[0:n] * b[0:n]
inline void fma_row(float* acc, const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  for (; i + simd::kWidth <= n; i += simd::kWidth) {
    simd::store(acc + i, simd::fma(simd::load(a + i), simd::load(b + i), simd::load(acc + i)));
  }
  for (; i < n; ++i) {
    acc[i] = simd::fma(a[i], b[i], acc[i]);
  }
}

// acc[0:n] += s * b[0:n]
inline void axpy(float* acc, float s, const float* b, int64_t n) {
  const vec sv = simd::broadcast(s);
  int64_t i = 0;
  for (; i + simd::kWidth <= n; i += simd::kWidth) {
    simd::store(acc + i, simd::fma(sv, simd::load(b + i), simd::load(acc + i)));
  }
  for (; i < n; ++i) {
    acc[i] = simd::fma(s, b[i], acc[i]);
  }
}

// acc[0:NV vectors] += sum over a < m of x[a] * w[a * ldw + 0:NV vectors],
// the NV vectors of acc held in registers across the m inputs (a
// compile-time NV: a runtime count left them on the stack).
template <int NV>
inline void group_block(float* acc, const float* x, const float* w, int64_t ldw, int m) {
  vec r[NV];
  for (int v = 0; v < NV; ++v) {
    r[v] = simd::load(acc + v * simd::kWidth);
  }
  for (int a = 0; a < m; ++a) {
    const vec xb = simd::broadcast(x[a]);
    const float* wr = w + a * ldw;
    for (int v = 0; v < NV; ++v) {
      r[v] = simd::fma(xb, simd::load(wr + v * simd::kWidth), r[v]);
    }
  }
  for (int v = 0; v < NV; ++v) {
    simd::store(acc + v * simd::kWidth, r[v]);
  }
}

// acc[0:n] += sum over a < m of x[a] * w[a * ldw + 0:n]: blocks of up to 4
// vectors, then single columns.
inline void group_product(float* acc, const float* x, const float* w, int64_t ldw, int m, int n) {
  int c0 = 0;
  for (; c0 + 4 * simd::kWidth <= n; c0 += 4 * simd::kWidth) {
    group_block<4>(acc + c0, x, w + c0, ldw, m);
  }
  switch ((n - c0) / simd::kWidth) {
    case 3:
      group_block<3>(acc + c0, x, w + c0, ldw, m);
      break;
    case 2:
      group_block<2>(acc + c0, x, w + c0, ldw, m);
      break;
    case 1:
      group_block<1>(acc + c0, x, w + c0, ldw, m);
      break;
    default:
      break;
  }
  c0 += (n - c0) / simd::kWidth * simd::kWidth;
  for (int c = c0; c < n; ++c) {
    float t = acc[c];
    for (int a = 0; a < m; ++a) {
      t = simd::fma(x[a], w[a * ldw + c], t);
    }
    acc[c] = t;
  }
}

template <typename T>
std::vector<float> widen(const T* p, int64_t n) {
  std::vector<float> f(n);
  to_float(p, f.data(), n);
  return f;
}

// Channel layout of a grouped product: A inputs, B outputs, G groups.
struct Groups {
  int A, B, G, Ag, Bg;
  Groups(int a, int b, int g) : A(a), B(b), G(g), Ag(a / g), Bg(b / g) {}
  // Whether xs of channel a is the input row itself (no spreading needed).
  bool direct() const {
    return Ag == 1 && Bg == 1;
  }
  // Whether each group's outputs fill at least one vector (a GEMM per group).
  bool blocked() const {
    return !direct() && Bg >= simd::kWidth;
  }
  // xs[c] = x[(c / Bg) * Ag + a] for c in [0, B).
  void spread(const float* x, int a, float* xs) const {
    for (int j = 0; j < G; ++j) {
      const float v = x[j * Ag + a];
      std::fill(xs + j * Bg, xs + (j + 1) * Bg, v);
    }
  }
};

template <typename T>
void run_conv(const T* x, const T* w, CsrView v, int64_t n_x, int64_t K, Groups gr, T* y) {
  const auto xf = widen(x, n_x * gr.A);
  const auto wf = widen(w, K * gr.Ag * gr.B);
  const int B = gr.B;
  parallel_for(v.rows, 64, [&](int64_t r0, int64_t r1) {
    std::vector<float> acc(B), xs(B);
    for (int64_t r = r0; r < r1; ++r) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      const int64_t e0 = v.offsets ? v.offsets[r] : r;
      const int64_t e1 = v.offsets ? v.offsets[r + 1] : r + 1;
      for (int64_t e = e0; e < e1; ++e) {
        const float* xr = xf.data() + int64_t(v.offsets ? v.gather[e] : r) * gr.A;
        const float* wk = wf.data() + int64_t(v.offsets ? v.k[e] : 0) * gr.Ag * B;
        if (gr.blocked()) {
          for (int j = 0; j < gr.G; ++j) {
            group_product(
                acc.data() + j * gr.Bg, xr + j * gr.Ag, wk + j * gr.Bg, B, gr.Ag, gr.Bg);
          }
          continue;
        }
        for (int a = 0; a < gr.Ag; ++a) {
          const float* s = xr;
          if (!gr.direct()) {
            gr.spread(xr, a, xs.data());
            s = xs.data();
          }
          fma_row(acc.data(), s, wk + int64_t(a) * B, B);
        }
      }
      from_float(acc.data(), y + r * B, B);
    }
  });
}

constexpr int64_t kChunk = 2048; // edges per weight-gradient partial

template <typename T>
void run_wgrad(const T* x, const T* ct, PairView v, int64_t n_x, int64_t n_ct, Groups gr, T* out) {
  const auto xf = widen(x, n_x * gr.A);
  const auto cf = widen(ct, n_ct * gr.B);
  const int B = gr.B;
  const int64_t panel = int64_t(gr.Ag) * B;
  // Chunks of each offset's edges, fixed by the problem; chunk i of offset k
  // is chunks[first[k] + i].
  struct Chunk {
    int64_t k, e0, e1;
  };
  std::vector<Chunk> chunks;
  std::vector<int64_t> first(v.k + 1, 0);
  for (int64_t k = 0; k < v.k; ++k) {
    first[k] = chunks.size();
    const int64_t b = v.offsets ? v.offsets[k] : 0;
    const int64_t e = v.offsets ? v.offsets[k + 1] : v.edges;
    for (int64_t s = b; s < e; s += kChunk) {
      chunks.push_back({k, s, std::min(e, s + kChunk)});
    }
  }
  first[v.k] = chunks.size();
  std::vector<float> partial(chunks.size() * panel, 0.0f);
  parallel_for(chunks.size(), 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> xs(B);
    for (int64_t c = c0; c < c1; ++c) {
      float* p = partial.data() + c * panel;
      for (int64_t e = chunks[c].e0; e < chunks[c].e1; ++e) {
        const float* xr = xf.data() + int64_t(v.offsets ? v.g[e] : e) * gr.A;
        const float* cr = cf.data() + int64_t(v.offsets ? v.r[e] : e) * B;
        if (gr.blocked()) {
          for (int j = 0; j < gr.G; ++j) {
            for (int a = 0; a < gr.Ag; ++a) {
              axpy(p + int64_t(a) * B + j * gr.Bg, xr[j * gr.Ag + a], cr + j * gr.Bg, gr.Bg);
            }
          }
          continue;
        }
        for (int a = 0; a < gr.Ag; ++a) {
          const float* s = xr;
          if (!gr.direct()) {
            gr.spread(xr, a, xs.data());
            s = xs.data();
          }
          fma_row(p + int64_t(a) * B, s, cr, B);
        }
      }
    }
  });
  // Partials of each offset added in chunk order.
  parallel_for(v.k, 1, [&](int64_t k0, int64_t k1) {
    std::vector<float> acc(panel);
    for (int64_t k = k0; k < k1; ++k) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t c = first[k]; c < first[k + 1]; ++c) {
        const float* p = partial.data() + c * panel;
        for (int64_t i = 0; i < panel; ++i) {
          acc[i] += p[i];
        }
      }
      from_float(acc.data(), out + k * panel, panel);
    }
  });
}

} // namespace

void grouped_conv(
    Float t,
    const void* x,
    const void* w,
    int groups,
    CsrView v,
    int64_t n_x,
    int64_t K,
    int A,
    int B,
    void* y) {
  const Groups gr(A, B, groups);
  dispatch_float(t, [&]<typename T>() {
    run_conv<T>(static_cast<const T*>(x), static_cast<const T*>(w), v, n_x, K, gr,
                static_cast<T*>(y));
  });
}

void grouped_weight_grad(
    Float t,
    const void* x,
    const void* ct,
    int groups,
    PairView v,
    int64_t n_x,
    int64_t n_ct,
    int A,
    int B,
    void* out) {
  const Groups gr(A, B, groups);
  dispatch_float(t, [&]<typename T>() {
    run_wgrad<T>(static_cast<const T*>(x), static_cast<const T*>(ct), v, n_x, n_ct, gr,
                 static_cast<T*>(out));
  });
}

} // namespace mlx_lattice::cpu::LATTICE_ISA

#include "cpu/isa_end.h"
