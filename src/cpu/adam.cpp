// The fused Adam / AdamW update (the AdamUpdate primitive of src/core/optim.cpp),
// compiled per instruction-set path: one pass over the parameter, its
// gradient and both moments, where MLX's optimizer runs a dozen elementwise
// ops with a temporary each.
//
// Every step rounds to float32 as MLX's ops do, in MLX's order, and this
// file is compiled without floating-point contraction (CMakeLists.txt): the
// results are bitwise those of mlx.optimizers.Adam / AdamW on float32.
#include <cmath>

#include "cpu/isa_begin.h"

#include "cpu/simd.h"

namespace mlx_lattice::cpu::LATTICE_ISA {

namespace {

// Elements per task: large enough that small parameters stay on one thread.
constexpr int64_t kGrain = 1 << 15;

typedef simd::vec vec;

template <typename V>
inline V ld(const float* p) {
  if constexpr (std::is_same_v<V, float>) {
    return *p;
  } else {
    return simd::load(p);
  }
}

inline void st(float* p, float v) {
  *p = v;
}

inline void st(float* p, vec v) {
  simd::store(p, v);
}

// IEEE square roots (correctly rounded, as MLX's sqrt).
template <typename V>
inline V vsqrt(V x) {
  if constexpr (std::is_same_v<V, float>) {
    return std::sqrt(x);
  } else {
#if LATTICE_ISA_ID == 2
    return reinterpret_cast<vec>(_mm512_sqrt_ps(reinterpret_cast<__m512>(x)));
#elif LATTICE_ISA_ID == 1
    return reinterpret_cast<vec>(_mm256_sqrt_ps(reinterpret_cast<__m256>(x)));
#elif defined(__x86_64__) || defined(_M_X64)
    return reinterpret_cast<vec>(_mm_sqrt_ps(reinterpret_cast<__m128>(x)));
#else
    V r;
    for (int i = 0; i < simd::kWidth; ++i) {
      r[i] = std::sqrt(x[i]);
    }
    return r;
#endif
  }
}

// One element (V = float) or one vector (V = vec) of the update.
template <typename V>
inline void step(
    const AdamCoefficients& k,
    float lr,
    float c2,
    float decay,
    const float* g,
    const float* p,
    const float* m,
    const float* v,
    float* p_out,
    float* m_out,
    float* v_out) {
  const V gv = ld<V>(g);
  V pv = ld<V>(p);
  if (k.decoupled_decay) {
    pv = pv * decay;
  }
  const V b1m = k.b1 * ld<V>(m);
  const V g1 = k.one_minus_b1 * gv;
  const V mv = b1m + g1;
  const V b2v = k.b2 * ld<V>(v);
  const V gg = gv * gv;
  const V g2 = k.one_minus_b2 * gg;
  const V vv = b2v + g2;
  const V root = vsqrt(vv);
  V out;
  if (k.bias_correction) {
    const V num = lr * mv;
    const V den = root * c2 + k.eps;
    out = pv - num / den;
  } else {
    const V num = lr * mv;
    const V den = root + k.eps;
    out = pv - num / den;
  }
  st(m_out, mv);
  st(v_out, vv);
  st(p_out, out);
}

} // namespace

void adam_update(
    int64_t n,
    AdamCoefficients k,
    const float* scalars,
    const float* g,
    const float* p,
    const float* m,
    const float* v,
    float* p_out,
    float* m_out,
    float* v_out) {
  // scalars: the learning rate (c1 = lr / (1 - b1^t) with bias correction),
  // c2 = 1 / sqrt(1 - b2^t) and the decay factor 1 - lr * weight_decay.
  const float lr = scalars[0], c2 = scalars[1], decay = scalars[2];
  parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) {
    int64_t i = i0;
    for (; i + simd::kWidth <= i1; i += simd::kWidth) {
      step<vec>(k, lr, c2, decay, g + i, p + i, m + i, v + i, p_out + i, m_out + i, v_out + i);
    }
    for (; i < i1; ++i) {
      step<float>(k, lr, c2, decay, g + i, p + i, m + i, v + i, p_out + i, m_out + i, v_out + i);
    }
  });
}

} // namespace mlx_lattice::cpu::LATTICE_ISA

#include "cpu/isa_end.h"
