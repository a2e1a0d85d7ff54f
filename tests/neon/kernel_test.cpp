// Standalone check of one instruction-set path of the CPU kernels, without
// MLX's library (its header-only half types only): random problems against
// a double-precision reference written here, and bitwise equality across
// thread counts. Built by tests/test_neon.py for the NEON path with an
// aarch64 cross compiler and run under qemu-aarch64; any path builds the
// same way (-DLATTICE_ISA_ID=<id>, -DLATTICE_ISA_NAME=<path>).
//
// Exit status 0 when every case passes; prints one line per failure.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <random>
#include <vector>

#include "core/threadpool.h"
#include "cpu/isa.h"
#include "mlx/types/bf16.h"
#include "mlx/types/half_types.h"

#if !defined(LATTICE_ISA_NAME)
#error "compile with -DLATTICE_ISA_NAME=<path namespace>"
#endif
#define LATTICE_STRING_(x) #x
#define LATTICE_STRING(x) LATTICE_STRING_(x)

namespace mlx_lattice::cpu::LATTICE_ISA_NAME {
void gather_conv(
    Float, const void*, const void*, WeightStrides, CsrView, int64_t, int64_t, int, int, void*);
void gather_conv_quantized(
    Float, Float, const void*, const uint32_t*, const void*, const void*, int, int, CsrView,
    int64_t, int64_t, int, int, void*);
void weight_grad(
    Float, const void*, const void*, PairView, int64_t, int64_t, int, int, WeightStrides, void*);
void grouped_conv(Float, const void*, const void*, int, CsrView, int64_t, int64_t, int, int, void*);
void grouped_weight_grad(
    Float, const void*, const void*, int, PairView, int64_t, int64_t, int, int, void*);
void attention_forward(
    Float, AttentionShape, StridedView, StridedView, StridedView, const int32_t*, void*, float*);
void attention_backward(
    Float, AttentionShape, StridedView, StridedView, StridedView, const int32_t*, StridedView,
    const float*, StridedView, const float*, void*, void*, void*);
} // namespace mlx_lattice::cpu::LATTICE_ISA_NAME

namespace {

using namespace mlx_lattice;
using namespace mlx_lattice::cpu;
namespace path = mlx_lattice::cpu::LATTICE_ISA_NAME;
using mlx::core::bfloat16_t;
using mlx::core::float16_t;

int failures = 0;
int checks = 0;

void fail(const char* what, int A, int B, int64_t K, const char* dtype, double err, double bound) {
  ++failures;
  std::printf("FAIL %s A=%d B=%d K=%lld %s: error %g > %g\n", what, A, B, (long long)K, dtype, err, bound);
}

template <typename T>
struct Typed;
template <>
struct Typed<float> {
  static constexpr Float tag = Float::f32;
  static constexpr const char* name = "float32";
  static constexpr double eps = 1.2e-7;
  static constexpr double tiny = 1e-30;
};
template <>
struct Typed<float16_t> {
  static constexpr Float tag = Float::f16;
  static constexpr const char* name = "float16";
  static constexpr double eps = 9.8e-4;
  static constexpr double tiny = 3.0e-8; // half the smallest subnormal
};
template <>
struct Typed<bfloat16_t> {
  static constexpr Float tag = Float::bf16;
  static constexpr const char* name = "bfloat16";
  static constexpr double eps = 7.9e-3;
  static constexpr double tiny = 1e-30;
};

template <typename T>
std::vector<T> random_values(std::mt19937& gen, size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<T> v(n);
  for (auto& x : v) {
    x = static_cast<T>(d(gen));
  }
  return v;
}

template <typename T>
double value(T x) {
  return static_cast<double>(static_cast<float>(x));
}

// A random relation: `rows` outputs, each with a random subset of K offsets,
// gathering random input rows; no output row repeats an offset.
struct Relation {
  std::vector<int32_t> offsets, gather, k; // CSR by output row
  std::vector<int32_t> pk, pg, pr;         // kernel-major pairs
};

Relation random_relation(std::mt19937& gen, int64_t rows, int64_t n_in, int64_t K) {
  Relation r;
  std::uniform_int_distribution<int32_t> in(0, int32_t(n_in - 1));
  std::bernoulli_distribution keep(0.4);
  r.offsets.push_back(0);
  for (int64_t o = 0; o < rows; ++o) {
    for (int64_t k = 0; k < K; ++k) {
      if (n_in > 0 && keep(gen)) {
        r.gather.push_back(in(gen));
        r.k.push_back(int32_t(k));
      }
    }
    r.offsets.push_back(int32_t(r.gather.size()));
  }
  r.pk.assign(K + 1, 0);
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t o = 0; o < rows; ++o) {
      for (int32_t e = r.offsets[o]; e < r.offsets[o + 1]; ++e) {
        if (r.k[e] == k) {
          r.pg.push_back(r.gather[e]);
          r.pr.push_back(int32_t(o));
        }
      }
    }
    r.pk[k + 1] = int32_t(r.pg.size());
  }
  return r;
}

template <typename T>
void check_close(
    const char* what, const std::vector<T>& got, const std::vector<double>& want,
    const std::vector<double>& magnitude, int A, int B, int64_t K, int terms) {
  ++checks;
  // |error| of a sum of `terms` products, each rounded to float32, and of
  // the result's rounding to T: bounded relative to the sum of |products|,
  // plus the rounding of a result below T's normal range.
  double worst = 0.0, worst_err = 0.0, worst_bound = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = (Typed<T>::eps + 1.2e-7 * terms) * magnitude[i] + Typed<T>::tiny;
    const double err = std::fabs(value(got[i]) - want[i]);
    const double ratio = std::isnan(err) ? 1e300 : err / bound;
    if (ratio > worst) {
      worst = ratio;
      worst_err = err;
      worst_bound = bound;
    }
  }
  if (worst > 1.0) {
    fail(what, A, B, K, Typed<T>::name, worst_err, worst_bound);
  }
}

template <typename T>
void run_case(std::mt19937& gen, int64_t rows, int64_t n_in, int64_t K, int A, int B) {
  const auto x = random_values<T>(gen, n_in * A, 1.0f);
  const auto w = random_values<T>(gen, K * A * B, 0.2f);
  const auto ct = random_values<T>(gen, rows * B, 1.0f);
  const Relation rel = random_relation(gen, rows, n_in, K);
  const int64_t edges = int64_t(rel.gather.size());
  CsrView csr{rel.offsets.data(), rel.gather.data(), rel.k.data(), rows, edges};
  PairView pairs{rel.pk.data(), rel.pg.data(), rel.pr.data(), K, edges};

  // reference, double precision
  std::vector<double> y_ref(rows * B, 0.0), y_mag(rows * B, 0.0);
  std::vector<double> dw_ref(K * A * B, 0.0), dw_mag(K * A * B, 0.0);
  for (int64_t o = 0; o < rows; ++o) {
    for (int32_t e = rel.offsets[o]; e < rel.offsets[o + 1]; ++e) {
      const int64_t g = rel.gather[e], k = rel.k[e];
      for (int a = 0; a < A; ++a) {
        for (int b = 0; b < B; ++b) {
          const double p = value(x[g * A + a]) * value(w[(k * A + a) * B + b]);
          y_ref[o * B + b] += p;
          y_mag[o * B + b] += std::fabs(p);
          const double q = value(x[g * A + a]) * value(ct[o * B + b]);
          dw_ref[(k * A + a) * B + b] += q;
          dw_mag[(k * A + a) * B + b] += std::fabs(q);
        }
      }
    }
  }
  const int y_terms = int(A * K);
  int dw_terms = 0;
  for (int64_t k = 0; k < K; ++k) {
    dw_terms = std::max(dw_terms, rel.pk[k + 1] - rel.pk[k]);
  }

  for (int threads : {1, 3}) {
    set_num_threads(threads);
    std::vector<T> y(rows * B), dw(K * A * B);
    const WeightStrides row_major{int64_t(A) * B, B, 1};
    path::gather_conv(Typed<T>::tag, x.data(), w.data(), row_major, csr, n_in, K, A, B, y.data());
    path::weight_grad(
        Typed<T>::tag, x.data(), ct.data(), pairs, n_in, rows, A, B, row_major, dw.data());
    static std::vector<T> y1, dw1;
    if (threads == 1) {
      check_close("gather_conv", y, y_ref, y_mag, A, B, K, y_terms);
      check_close("weight_grad", dw, dw_ref, dw_mag, A, B, K, dw_terms);
      y1 = y;
      dw1 = dw;
    } else {
      ++checks;
      if (std::memcmp(y.data(), y1.data(), y.size() * sizeof(T)) != 0 ||
          std::memcmp(dw.data(), dw1.data(), dw.size() * sizeof(T)) != 0) {
        fail("bitwise across thread counts", A, B, K, Typed<T>::name, 1, 0);
      }
    }
  }
  // Each output sums its offsets in increasing order whatever the order of
  // a row's edges in the view: reversed rows give the same bits.
  std::vector<int32_t> gather_rev(rel.gather), k_rev(rel.k);
  for (int64_t o = 0; o < rows; ++o) {
    std::reverse(gather_rev.begin() + rel.offsets[o], gather_rev.begin() + rel.offsets[o + 1]);
    std::reverse(k_rev.begin() + rel.offsets[o], k_rev.begin() + rel.offsets[o + 1]);
  }
  CsrView reversed{rel.offsets.data(), gather_rev.data(), k_rev.data(), rows, edges};
  std::vector<T> y_rev(rows * B);
  const WeightStrides row_major{int64_t(A) * B, B, 1};
  path::gather_conv(
      Typed<T>::tag, x.data(), w.data(), row_major, reversed, n_in, K, A, B, y_rev.data());
  std::vector<T> y_sorted(rows * B);
  path::gather_conv(Typed<T>::tag, x.data(), w.data(), row_major, csr, n_in, K, A, B, y_sorted.data());
  ++checks;
  if (std::memcmp(y_rev.data(), y_sorted.data(), y_rev.size() * sizeof(T)) != 0) {
    fail("gather_conv: edge order within rows", A, B, K, Typed<T>::name, 1, 0);
  }
  // The row-major traversal (cpu.row_gather) sums as the grouped one, rows
  // in offset order or not.
  for (CsrView v : {csr, reversed}) {
    v.row_major = true;
    std::vector<T> y_rows(rows * B);
    path::gather_conv(Typed<T>::tag, x.data(), w.data(), row_major, v, n_in, K, A, B, y_rows.data());
    ++checks;
    if (std::memcmp(y_rows.data(), y_sorted.data(), y_rows.size() * sizeof(T)) != 0) {
      fail("gather_conv: row-major traversal", A, B, K, Typed<T>::name, 1, 0);
    }
  }
}

// Grouped products: w (K, A / G, B); output c reads the inputs of group
// c / (B / G).
template <typename T>
void run_grouped(std::mt19937& gen, int64_t rows, int64_t n_in, int64_t K, int A, int B, int G) {
  const int Ag = A / G, Bg = B / G;
  const auto x = random_values<T>(gen, n_in * A, 1.0f);
  const auto w = random_values<T>(gen, K * Ag * B, 0.2f);
  const auto ct = random_values<T>(gen, rows * B, 1.0f);
  const Relation rel = random_relation(gen, rows, n_in, K);
  const int64_t edges = int64_t(rel.gather.size());
  CsrView csr{rel.offsets.data(), rel.gather.data(), rel.k.data(), rows, edges};
  PairView pairs{rel.pk.data(), rel.pg.data(), rel.pr.data(), K, edges};

  std::vector<double> y_ref(rows * B, 0.0), y_mag(rows * B, 0.0);
  std::vector<double> dw_ref(K * Ag * B, 0.0), dw_mag(K * Ag * B, 0.0);
  for (int64_t o = 0; o < rows; ++o) {
    for (int32_t e = rel.offsets[o]; e < rel.offsets[o + 1]; ++e) {
      const int64_t g = rel.gather[e], k = rel.k[e];
      for (int c = 0; c < B; ++c) {
        for (int a = 0; a < Ag; ++a) {
          const double xv = value(x[g * A + (c / Bg) * Ag + a]);
          const int64_t wi = (k * Ag + a) * B + c;
          const double p = xv * value(w[wi]);
          y_ref[o * B + c] += p;
          y_mag[o * B + c] += std::fabs(p);
          const double q = xv * value(ct[o * B + c]);
          dw_ref[wi] += q;
          dw_mag[wi] += std::fabs(q);
        }
      }
    }
  }
  int dw_terms = 0;
  for (int64_t k = 0; k < K; ++k) {
    dw_terms = std::max(dw_terms, rel.pk[k + 1] - rel.pk[k]);
  }

  std::vector<T> y1, dw1;
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    std::vector<T> y(rows * B), dw(K * Ag * B);
    path::grouped_conv(Typed<T>::tag, x.data(), w.data(), G, csr, n_in, K, A, B, y.data());
    path::grouped_weight_grad(Typed<T>::tag, x.data(), ct.data(), G, pairs, n_in, rows, A, B, dw.data());
    if (threads == 1) {
      check_close("grouped_conv", y, y_ref, y_mag, A, B, K, int(Ag * K));
      check_close("grouped_weight_grad", dw, dw_ref, dw_mag, A, B, K, dw_terms);
      y1 = y;
      dw1 = dw;
    } else {
      ++checks;
      if (std::memcmp(y.data(), y1.data(), y.size() * sizeof(T)) != 0 ||
          std::memcmp(dw.data(), dw1.data(), dw.size() * sizeof(T)) != 0) {
        fail("grouped bitwise across thread counts", A, B, K, Typed<T>::name, 1, 0);
      }
    }
  }
}

// Affine-quantized weights (MLX packing): codes along A, 32/bits per word,
// one float scale and bias per group; logical shape (B, K, A).
void run_quantized(std::mt19937& gen, int64_t rows, int64_t n_in, int64_t K, int A, int B, int bits, int group) {
  const auto x = random_values<float>(gen, n_in * A, 1.0f);
  const int per_word = 32 / bits;
  std::uniform_int_distribution<uint32_t> code(0, (1u << bits) - 1);
  std::vector<uint32_t> codes(B * K * A / per_word, 0);
  std::vector<double> wq(K * A * B); // dequantized, (K, A, B)
  const auto scales = random_values<float>(gen, B * K * A / group, 0.01f);
  const auto biases = random_values<float>(gen, B * K * A / group, 0.05f);
  for (int b = 0; b < B; ++b) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t row = int64_t(b) * K + k;
      for (int a = 0; a < A; ++a) {
        const uint32_t q = code(gen);
        codes[row * (A / per_word) + a / per_word] |= q << ((a % per_word) * bits);
        const int64_t gi = row * (A / group) + a / group;
        wq[(k * A + a) * B + b] = double(scales[gi] * float(q) + biases[gi]);
      }
    }
  }
  const Relation rel = random_relation(gen, rows, n_in, K);
  CsrView csr{rel.offsets.data(), rel.gather.data(), rel.k.data(), rows, int64_t(rel.gather.size())};
  std::vector<double> y_ref(rows * B, 0.0), y_mag(rows * B, 0.0);
  for (int64_t o = 0; o < rows; ++o) {
    for (int32_t e = rel.offsets[o]; e < rel.offsets[o + 1]; ++e) {
      for (int a = 0; a < A; ++a) {
        for (int b = 0; b < B; ++b) {
          const double p = double(x[rel.gather[e] * A + a]) * wq[(rel.k[e] * A + a) * B + b];
          y_ref[o * B + b] += p;
          y_mag[o * B + b] += std::fabs(p);
        }
      }
    }
  }
  std::vector<float> y(rows * B);
  path::gather_conv_quantized(
      Float::f32, Float::f32, x.data(), codes.data(), scales.data(), biases.data(), bits, group,
      csr, n_in, K, A, B, y.data());
  check_close("gather_conv_quantized", y, y_ref, y_mag, A, B, K, int(A * K));
}

// Patch attention (patches, heads, P, D), contiguous, against a double
// reference over each patch's first lengths[b] rows; padding rows are zero.
template <typename T>
void run_attention(std::mt19937& gen, int64_t patches, int heads, int P, int D) {
  const int64_t n = patches * heads * P * D, per = int64_t(P) * D;
  const auto q = random_values<T>(gen, n, 1.0f), k = random_values<T>(gen, n, 1.0f);
  const auto v = random_values<T>(gen, n, 1.0f), dout = random_values<T>(gen, n, 1.0f);
  const auto dlse = random_values<float>(gen, patches * heads * P, 1.0f);
  std::vector<int32_t> lengths(patches);
  std::uniform_int_distribution<int32_t> len(0, P);
  for (auto& l : lengths) {
    l = len(gen);
  }
  lengths[0] = P;
  const float scale = 0.7f / std::sqrt(float(D));
  std::vector<double> o_ref(n, 0.0), lse_ref(patches * heads * P, 0.0);
  std::vector<double> dq_ref(n, 0.0), dk_ref(n, 0.0), dv_ref(n, 0.0);
  for (int64_t bh = 0; bh < patches * heads; ++bh) {
    const int L = lengths[bh / heads];
    const int64_t base = bh * per;
    auto at = [&](const std::vector<T>& a, int i, int d) { return value(a[base + int64_t(i) * D + d]); };
    std::vector<double> p(int64_t(L) * L), dp(int64_t(L) * L);
    for (int i = 0; i < L; ++i) {
      double m = -INFINITY, sum = 0.0, dot = 0.0;
      for (int j = 0; j < L; ++j) {
        double s = 0.0;
        for (int d = 0; d < D; ++d) {
          s += at(q, i, d) * at(k, j, d);
        }
        p[i * L + j] = scale * s;
        m = std::max(m, scale * s);
      }
      for (int j = 0; j < L; ++j) {
        sum += (p[i * L + j] = std::exp(p[i * L + j] - m));
      }
      for (int j = 0; j < L; ++j) {
        p[i * L + j] /= sum;
        for (int d = 0; d < D; ++d) {
          o_ref[base + int64_t(i) * D + d] += p[i * L + j] * at(v, j, d);
        }
      }
      lse_ref[bh * P + i] = m + std::log(sum);
      for (int d = 0; d < D; ++d) {
        dot += at(dout, i, d) * o_ref[base + int64_t(i) * D + d];
      }
      // dS_ij = P_ij (dO_i . V_j - dO_i . O_i + dlse_i)
      for (int j = 0; j < L; ++j) {
        double dpv = 0.0;
        for (int d = 0; d < D; ++d) {
          dpv += at(dout, i, d) * at(v, j, d);
        }
        dp[i * L + j] = p[i * L + j] * (dpv - dot + dlse[bh * P + i]);
      }
    }
    for (int i = 0; i < L; ++i) {
      for (int j = 0; j < L; ++j) {
        for (int d = 0; d < D; ++d) {
          dv_ref[base + int64_t(j) * D + d] += p[i * L + j] * at(dout, i, d);
          dq_ref[base + int64_t(i) * D + d] += scale * dp[i * L + j] * at(k, j, d);
          dk_ref[base + int64_t(j) * D + d] += scale * dp[i * L + j] * at(q, i, d);
        }
      }
    }
  }
  const AttentionShape shape{patches, heads, P, D, scale};
  auto view = [&](const std::vector<T>& a) {
    return StridedView{a.data(), {int64_t(heads) * per, per, D, 1}};
  };
  // Errors relative to a unit scale: inputs are unit normals.
  auto close = [&](const char* what, const auto& got, const std::vector<double>& want, double tol) {
    ++checks;
    for (size_t i = 0; i < want.size(); ++i) {
      const double err = std::fabs(value(got[i]) - want[i]);
      const double bound = tol * (1.0 + std::fabs(want[i]));
      if (!(err <= bound)) {
        fail(what, D, P, patches, Typed<T>::name, err, bound);
        return;
      }
    }
  };
  const double tol = 4 * Typed<T>::eps + 2e-5;
  std::vector<T> o1, g1;
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    std::vector<T> o(n), dq(n), dk(n), dv(n);
    std::vector<float> lse(patches * heads * P);
    path::attention_forward(Typed<T>::tag, shape, view(q), view(k), view(v), lengths.data(),
                            o.data(), lse.data());
    path::attention_backward(Typed<T>::tag, shape, view(q), view(k), view(v), lengths.data(),
                             view(o), lse.data(), view(dout), dlse.data(), dq.data(), dk.data(),
                             dv.data());
    std::vector<T> g(dq);
    g.insert(g.end(), dk.begin(), dk.end());
    g.insert(g.end(), dv.begin(), dv.end());
    if (threads == 1) {
      close("attention o", o, o_ref, tol);
      close("attention lse", lse, lse_ref, 2e-5);
      close("attention dq", dq, dq_ref, tol);
      close("attention dk", dk, dk_ref, tol);
      close("attention dv", dv, dv_ref, tol);
      o1 = o;
      g1 = g;
    } else {
      ++checks;
      if (std::memcmp(o.data(), o1.data(), n * sizeof(T)) != 0 ||
          std::memcmp(g.data(), g1.data(), g.size() * sizeof(T)) != 0) {
        fail("attention bitwise across thread counts", D, P, patches, Typed<T>::name, 1, 0);
      }
    }
  }
}

} // namespace

int main() {
  std::mt19937 gen(14);
  // (rows, inputs, K, A, B): awkward and vector-multiple channel counts,
  // single offsets, empty relations, enough edges for several chunks.
  const int64_t shapes[][5] = {
      {50, 40, 27, 3, 5},   {64, 64, 27, 16, 16}, {33, 70, 8, 17, 33}, {40, 40, 1, 65, 7},
      {30, 20, 27, 32, 64}, {25, 30, 8, 96, 72},  {0, 10, 27, 8, 8},   {12, 0, 27, 8, 8},
      {9000, 9000, 1, 8, 16}, {60, 60, 27, 4, 16},
  };
  for (const auto& s : shapes) {
    run_case<float>(gen, s[0], s[1], s[2], int(s[3]), int(s[4]));
    run_case<float16_t>(gen, s[0], s[1], s[2], int(s[3]), int(s[4]));
    run_case<bfloat16_t>(gen, s[0], s[1], s[2], int(s[3]), int(s[4]));
  }
  // (rows, inputs, K, A, B, groups): depthwise, depthwise with a channel
  // multiplier, spread groups, groups of whole vectors with a tail, chunks.
  const int64_t grouped[][6] = {
      {50, 40, 27, 17, 17, 17}, {40, 40, 27, 3, 6, 3},  {40, 40, 27, 12, 8, 4},
      {30, 30, 27, 34, 34, 2},  {30, 30, 8, 40, 80, 2}, {0, 10, 27, 8, 8, 8},
      {5000, 5000, 1, 6, 6, 6},
  };
  for (const auto& s : grouped) {
    run_grouped<float>(gen, s[0], s[1], s[2], int(s[3]), int(s[4]), int(s[5]));
    run_grouped<float16_t>(gen, s[0], s[1], s[2], int(s[3]), int(s[4]), int(s[5]));
    run_grouped<bfloat16_t>(gen, s[0], s[1], s[2], int(s[3]), int(s[4]), int(s[5]));
  }
  run_quantized(gen, 40, 40, 27, 64, 24, 4, 32);
  run_quantized(gen, 40, 40, 8, 64, 40, 8, 64);
  // (patches, heads, P, D): head dims around the vector width, patches
  // crossing the query (16) and key (128) blocks, padded patches.
  run_attention<float>(gen, 3, 2, 1, 3);
  run_attention<float>(gen, 4, 2, 33, 8);
  run_attention<float>(gen, 3, 1, 150, 24);
  run_attention<bfloat16_t>(gen, 3, 2, 40, 17);
  run_attention<float16_t>(gen, 2, 2, 20, 16);
  std::printf("%s: %d checks, %d failures\n", LATTICE_STRING(LATTICE_ISA_NAME), checks, failures);
  return failures == 0 ? 0 : 1;
}
