// Standalone digest of one instruction-set path of the CPU kernels: fixed
// problems (inputs from a generator written here, independent of the C++
// library), one line per result, "<name> <64-bit FNV-1a of its bytes>".
// Built by tests/test_cpu_compilers.py with each installed compiler for
// each path (-DLATTICE_ISA_ID=<id>, -DLATTICE_ISA_NAME=<path>), without
// MLX's library (its header-only half types only): the digests of one path
// must not depend on the compiler, and those of avx2 and avx512 must agree
// except for attention (its query blocks follow the vector width).
#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <vector>

#include "core/threadpool.h"
#include "cpu/isa.h"
#include "mlx/types/bf16.h"
#include "mlx/types/half_types.h"

#if !defined(LATTICE_ISA_NAME)
#error "compile with -DLATTICE_ISA_NAME=<path namespace>"
#endif

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
void norm_forward(
    Float, NormShape, const void*, const float*, const float*, const void*, const int32_t*,
    const float*, const float*, float*, float*, void*);
void norm_backward(
    Float, NormShape, const void*, const void*, const void*, const float*, const float*,
    const float*, const float*, const int32_t*, const float*, const float*, void*, float*,
    float*, void*);
} // namespace mlx_lattice::cpu::LATTICE_ISA_NAME

namespace {

using namespace mlx_lattice;
using namespace mlx_lattice::cpu;
namespace path = mlx_lattice::cpu::LATTICE_ISA_NAME;
using mlx::core::bfloat16_t;
using mlx::core::float16_t;

// splitmix64: the same stream on every compiler and C++ library.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // uniform in [-scale, scale), 24 random bits
  float uniform(float scale) {
    return scale * (float(int32_t(next() >> 40) - (1 << 23)) / float(1 << 23));
  }
  uint32_t below(uint32_t n) {
    return uint32_t(next() % n);
  }
};

template <typename T>
std::vector<T> values(Rng& rng, size_t n, float scale) {
  std::vector<T> v(n);
  for (auto& x : v) {
    x = static_cast<T>(rng.uniform(scale));
  }
  return v;
}

template <typename T>
void digest(const char* name, const std::vector<T>& v) {
  uint64_t h = 0xCBF29CE484222325ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(T); ++i) {
    h = (h ^ p[i]) * 0x100000001B3ull;
  }
  std::printf("%s %016llx\n", name, (unsigned long long)h);
}

// Each output row takes a random subset of the K offsets (ascending), each
// gathering a random input row; pairs are the same edges offset-major.
struct Relation {
  std::vector<int32_t> offsets{0}, gather, k, pk, pg, pr, segments;
  CsrView csr() const {
    return {offsets.data(), gather.data(), k.data(), int64_t(offsets.size()) - 1, int64_t(gather.size())};
  }
  // The view with its offset groups (the pairs, as Relation::offset_groups).
  CsrView grouped_csr() const {
    CsrView v = csr();
    v.segments = segments.data();
    v.group_rows = pr.data();
    v.group_gather = pg.data();
    return v;
  }
  PairView pairs() const {
    return {pk.data(), pg.data(), pr.data(), int64_t(pk.size()) - 1, int64_t(pg.size())};
  }
};

Relation relation(Rng& rng, int64_t rows, int64_t n_in, int64_t K) {
  Relation r;
  for (int64_t o = 0; o < rows; ++o) {
    for (int64_t k = 0; k < K; ++k) {
      if (rng.below(5) < 2) {
        r.gather.push_back(int32_t(rng.below(uint32_t(n_in))));
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
    r.segments.push_back(r.pk[k]);
    r.segments.push_back(r.pk[k + 1]);
  }
  return r;
}

template <typename T>
constexpr Float tag() {
  return std::is_same_v<T, float> ? Float::f32 : std::is_same_v<T, float16_t> ? Float::f16 : Float::bf16;
}

// Forward and weight gradient of a dense-weight convolution.
template <typename T>
void conv(Rng& rng, int64_t rows, int64_t K, int A, int B) {
  const Relation rel = relation(rng, rows, rows, K);
  const auto x = values<T>(rng, rows * A, 1.0f), w = values<T>(rng, K * A * B, 0.3f);
  const auto ct = values<T>(rng, rows * B, 1.0f);
  const WeightStrides row_major{int64_t(A) * B, B, 1};
  std::vector<T> y(rows * B), dw(K * A * B);
  std::vector<T> y_groups(rows * B);
  path::gather_conv(tag<T>(), x.data(), w.data(), row_major, rel.csr(), rows, K, A, B, y.data());
  path::gather_conv(
      tag<T>(), x.data(), w.data(), row_major, rel.grouped_csr(), rows, K, A, B, y_groups.data());
  path::weight_grad(tag<T>(), x.data(), ct.data(), rel.pairs(), rows, rows, A, B, row_major, dw.data());
  char name[96];
  std::snprintf(name, sizeof(name), "gather_conv/%d/%d/%d", A, B, int(sizeof(T)));
  digest(name, y);
  std::snprintf(name, sizeof(name), "gather_conv_offset_groups/%d/%d/%d", A, B, int(sizeof(T)));
  digest(name, y_groups);
  std::snprintf(name, sizeof(name), "weight_grad/%d/%d/%d", A, B, int(sizeof(T)));
  digest(name, dw);
}

// The forward on the row-major traversal (cpu.row_gather), with the
// grouped traversal's result on the same problem: the two must agree.
template <typename T>
void conv_rows(Rng& rng, int64_t rows, int64_t K, int A, int B) {
  const Relation rel = relation(rng, rows, rows, K);
  const auto x = values<T>(rng, rows * A, 1.0f), w = values<T>(rng, K * A * B, 0.3f);
  const WeightStrides row_major{int64_t(A) * B, B, 1};
  CsrView v = rel.csr();
  std::vector<T> y(rows * B), y_grouped(rows * B);
  path::gather_conv(tag<T>(), x.data(), w.data(), row_major, v, rows, K, A, B, y_grouped.data());
  v.row_major = true;
  path::gather_conv(tag<T>(), x.data(), w.data(), row_major, v, rows, K, A, B, y.data());
  char name[96];
  std::snprintf(name, sizeof(name), "gather_conv_rows/%d/%d/%d", A, B, int(sizeof(T)));
  digest(name, y);
  std::snprintf(name, sizeof(name), "gather_conv_rows_grouped/%d/%d/%d", A, B, int(sizeof(T)));
  digest(name, y_grouped);
}

void quantized(Rng& rng, int64_t rows, int64_t K, int A, int B, int bits, int group) {
  const Relation rel = relation(rng, rows, rows, K);
  const auto x = values<float>(rng, rows * A, 1.0f);
  std::vector<uint32_t> codes(B * K * A / (32 / bits));
  for (auto& c : codes) {
    c = uint32_t(rng.next());
  }
  const auto scales = values<float>(rng, B * K * A / group, 0.02f);
  const auto biases = values<float>(rng, B * K * A / group, 0.1f);
  std::vector<float> y(rows * B), y_groups(rows * B);
  path::gather_conv_quantized(Float::f32, Float::f32, x.data(), codes.data(), scales.data(),
                              biases.data(), bits, group, rel.csr(), rows, K, A, B, y.data());
  path::gather_conv_quantized(Float::f32, Float::f32, x.data(), codes.data(), scales.data(),
                              biases.data(), bits, group, rel.grouped_csr(), rows, K, A, B,
                              y_groups.data());
  char name[96];
  std::snprintf(name, sizeof(name), "gather_conv_quantized/%d/%d/%d", A, B, bits);
  digest(name, y);
  std::snprintf(name, sizeof(name), "gather_conv_quantized_offset_groups/%d/%d/%d", A, B, bits);
  digest(name, y_groups);
}

template <typename T>
void grouped(Rng& rng, int64_t rows, int64_t K, int A, int B, int G) {
  const Relation rel = relation(rng, rows, rows, K);
  const auto x = values<T>(rng, rows * A, 1.0f), w = values<T>(rng, K * (A / G) * B, 0.3f);
  const auto ct = values<T>(rng, rows * B, 1.0f);
  std::vector<T> y(rows * B), dw(K * (A / G) * B);
  path::grouped_conv(tag<T>(), x.data(), w.data(), G, rel.csr(), rows, K, A, B, y.data());
  path::grouped_weight_grad(tag<T>(), x.data(), ct.data(), G, rel.pairs(), rows, rows, A, B, dw.data());
  char name[96];
  std::snprintf(name, sizeof(name), "grouped_conv/%d/%d/%d/%d", A, B, G, int(sizeof(T)));
  digest(name, y);
  std::snprintf(name, sizeof(name), "grouped_weight_grad/%d/%d/%d/%d", A, B, G, int(sizeof(T)));
  digest(name, dw);
}

// Batch norm + leaky ReLU over two segments, forward (with and without a
// residual) and backward (z's sign from x, and from y with g returned).
template <typename T>
void norm(Rng& rng, int64_t N, int64_t C) {
  const auto x = values<T>(rng, N * C, 2.0f), r = values<T>(rng, N * C, 1.0f);
  const auto ct = values<T>(rng, N * C, 1.0f);
  const auto w = values<float>(rng, C, 1.0f), b = values<float>(rng, C, 1.0f);
  std::vector<int32_t> seg(N);
  for (auto& s : seg) {
    s = int32_t(rng.below(2));
  }
  const NormShape sp{N, C, 2, true, 0.1f, 1e-5f};
  std::vector<float> mean(2 * C), var(2 * C), dw(C), db(C);
  const auto ct_mean = values<float>(rng, 2 * C, 1.0f), ct_var = values<float>(rng, 2 * C, 1.0f);
  std::vector<T> y(N * C), yr(N * C), dx(N * C), dxr(N * C), g(N * C);
  path::norm_forward(tag<T>(), sp, x.data(), w.data(), b.data(), nullptr, seg.data(), nullptr,
                     nullptr, mean.data(), var.data(), y.data());
  std::vector<float> stats(mean);
  stats.insert(stats.end(), var.begin(), var.end());
  path::norm_forward(tag<T>(), sp, x.data(), w.data(), b.data(), r.data(), seg.data(), nullptr,
                     nullptr, mean.data(), var.data(), yr.data());
  path::norm_backward(tag<T>(), sp, x.data(), y.data(), ct.data(), w.data(), b.data(),
                      mean.data(), var.data(), seg.data(), ct_mean.data(), ct_var.data(),
                      dx.data(), dw.data(), db.data(), nullptr);
  std::vector<float> dwb(dw);
  dwb.insert(dwb.end(), db.begin(), db.end());
  path::norm_backward(tag<T>(), sp, x.data(), yr.data(), ct.data(), w.data(), b.data(),
                      mean.data(), var.data(), seg.data(), ct_mean.data(), ct_var.data(),
                      dxr.data(), dw.data(), db.data(), g.data());
  char name[96];
  const char* parts[] = {"stats", "y", "y_residual", "dx", "dwb", "dx_residual", "g"};
  for (int i = 0; i < 7; ++i) {
    std::snprintf(name, sizeof(name), "norm_%s/%d/%d", parts[i], int(C), int(sizeof(T)));
    if (i == 0) {
      digest(name, stats);
    } else if (i == 4) {
      digest(name, dwb);
    } else {
      digest(name, i == 1 ? y : i == 2 ? yr : i == 3 ? dx : i == 5 ? dxr : g);
    }
  }
}

void attention(Rng& rng, int64_t patches, int heads, int P, int D) {
  const int64_t n = patches * heads * P * D, per = int64_t(P) * D;
  const auto q = values<float>(rng, n, 1.0f), k = values<float>(rng, n, 1.0f);
  const auto v = values<float>(rng, n, 1.0f), dout = values<float>(rng, n, 1.0f);
  const auto dlse = values<float>(rng, patches * heads * P, 1.0f);
  std::vector<int32_t> lengths(patches);
  for (auto& l : lengths) {
    l = int32_t(rng.below(uint32_t(P + 1)));
  }
  const AttentionShape shape{patches, heads, P, D, 0.3f};
  auto view = [&](const std::vector<float>& a) {
    return StridedView{a.data(), {int64_t(heads) * per, per, D, 1}};
  };
  std::vector<float> o(n), lse(patches * heads * P), dq(n), dk(n), dv(n);
  path::attention_forward(Float::f32, shape, view(q), view(k), view(v), lengths.data(), o.data(), lse.data());
  path::attention_backward(Float::f32, shape, view(q), view(k), view(v), lengths.data(), view(o),
                           lse.data(), view(dout), dlse.data(), dq.data(), dk.data(), dv.data());
  o.insert(o.end(), lse.begin(), lse.end());
  for (const auto* g : {&dq, &dk, &dv}) {
    o.insert(o.end(), g->begin(), g->end());
  }
  char name[96];
  std::snprintf(name, sizeof(name), "attention/%d/%d", P, D);
  digest(name, o);
}

} // namespace

int main() {
  set_num_threads(2);
  Rng rng{14};
  // Awkward and whole-vector channel counts; weight gradients read in place
  // (A + B <= 192, B whole vectors) and over packed panels; the staged
  // gather-GEMM (A of 16-64) over one block, blocks sharing a walk, and
  // blocks of different widths.
  const int shapes[][2] = {{3, 5},   {17, 33}, {24, 40}, {64, 64}, {96, 64},
                           {96, 72}, {128, 80}, {32, 32}, {16, 16}, {48, 128}, {32, 80}};
  for (const auto& s : shapes) {
    conv<float>(rng, 400, 27, s[0], s[1]);
  }
  conv<float16_t>(rng, 300, 8, 33, 13);
  conv<bfloat16_t>(rng, 300, 27, 48, 24);
  quantized(rng, 200, 27, 64, 24, 4, 32);
  // Narrow inputs on the row-major traversal: the stem, awkward widths.
  const int narrow[][2] = {{4, 16}, {1, 24}, {3, 5}, {8, 40}};
  for (const auto& s : narrow) {
    conv_rows<float>(rng, 400, 27, s[0], s[1]);
  }
  conv_rows<float16_t>(rng, 300, 8, 4, 13);
  // Depthwise, spread groups, groups of whole vectors with and without tails.
  const int groups[][3] = {{48, 48, 48}, {12, 8, 4}, {24, 48, 8}, {34, 34, 2}, {40, 80, 2}, {64, 64, 2}};
  for (const auto& g : groups) {
    grouped<float>(rng, 400, 27, g[0], g[1], g[2]);
  }
  grouped<float16_t>(rng, 300, 27, 3, 6, 3);
  norm<float>(rng, 700, 37);
  norm<float>(rng, 600, 67);
  norm<float16_t>(rng, 500, 45);
  attention(rng, 3, 2, 150, 24);
  return 0;
}
