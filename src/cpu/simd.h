// Portable SIMD vectors for the CPU micro-kernels (GCC/Clang vector
// extensions), sized by the instruction-set path being compiled (see
// cpu/isa_begin.h): 16 floats per vector with AVX-512, 8 with AVX2, 4 on the
// x86-64 baseline (SSE2) and NEON.
//
// The kernels are compiled without floating-point contraction
// (-ffp-contract=off, CMakeLists.txt): every multiply-add that should fuse
// is written as simd::fma, so where products and sums round is fixed by the
// source, never by the compiler's choice, and the paths with FMA (AVX2,
// AVX-512, NEON) give the same bits under any compiler.
#pragma once

#include "cpu/isa_begin.h"

namespace mlx_lattice::cpu::LATTICE_ISA::simd {

#if LATTICE_ISA_ID == 2
constexpr int kWidth = 16;
constexpr int kRegisters = 32;
#elif LATTICE_ISA_ID == 1
constexpr int kWidth = 8;
constexpr int kRegisters = 16;
#elif LATTICE_ISA_ID == 3
constexpr int kWidth = 4;
constexpr int kRegisters = 32;
#else
constexpr int kWidth = 4;
constexpr int kRegisters = 16;
#endif

typedef float vec __attribute__((vector_size(kWidth * sizeof(float))));

inline vec load(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof(vec));
  return v;
}

inline void store(float* p, vec v) {
  std::memcpy(p, &v, sizeof(vec));
}

inline vec broadcast(float s) {
  return vec{} + s;
}

// Broadcast straight from memory: one load-port micro-op, where a scalar load
// followed by a register broadcast would also occupy a shuffle port that the
// FMAs need (the inner loops issue one broadcast per row per input channel).
inline vec broadcast_load(const float* p) {
#if LATTICE_ISA_ID == 2
  return reinterpret_cast<vec>(_mm512_broadcastss_ps(_mm_load_ss(p)));
#elif LATTICE_ISA_ID == 1
  return reinterpret_cast<vec>(_mm256_broadcast_ss(p));
#else
  return vec{} + *p;
#endif
}

inline vec zero() {
  return vec{};
}

// a * b + c: rounded once on the paths with FMA; on the x86-64 baseline
// (SSE2 has none, and a software fmaf would cost a call per element) the
// product and the sum round apart, so that path matches the others only to
// rounding.
inline float fma(float a, float b, float c) {
#if LATTICE_ISA_ID == 0
  return a * b + c;
#else
  return __builtin_fmaf(a, b, c); // one vfmadd / fmadd instruction
#endif
}

// The same on whole vectors: the path's own vectors, or (norm_act.cpp's
// rows) 8-float vectors on AVX-512.
template <typename V>
inline V fma(V a, V b, V c) {
  static_assert(sizeof(V) % sizeof(float) == 0 && sizeof(V) > sizeof(float), "a float vector");
#if LATTICE_ISA_ID == 1 || LATTICE_ISA_ID == 2
  if constexpr (sizeof(V) == 16) {
    return reinterpret_cast<V>(_mm_fmadd_ps(
        reinterpret_cast<__m128>(a), reinterpret_cast<__m128>(b), reinterpret_cast<__m128>(c)));
  } else if constexpr (sizeof(V) == 32) {
    return reinterpret_cast<V>(_mm256_fmadd_ps(
        reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b), reinterpret_cast<__m256>(c)));
  } else {
#if LATTICE_ISA_ID == 2
    static_assert(sizeof(V) == 64, "4, 8 or 16 floats");
    return reinterpret_cast<V>(_mm512_fmadd_ps(
        reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b), reinterpret_cast<__m512>(c)));
#else
    static_assert(sizeof(V) == 0, "AVX2 vectors hold 4 or 8 floats");
#endif
  }
#elif LATTICE_ISA_ID == 3
  static_assert(sizeof(V) == 16, "NEON vectors hold 4 floats");
  return reinterpret_cast<V>(vfmaq_f32(
      reinterpret_cast<float32x4_t>(c), reinterpret_cast<float32x4_t>(a),
      reinterpret_cast<float32x4_t>(b)));
#else
  return a * b + c;
#endif
}

// Rows of an MR x (NV vectors) register tile such that the accumulators, one
// weight row and a broadcast fit in the register file.
constexpr int rows_for(int nv) {
  int mr = (kRegisters - nv - 2) / nv;
  return mr > 14 ? 14 : (mr < 1 ? 1 : mr);
}

// Widest register tile in vectors (a column block is kMaxVectors * kWidth).
#if LATTICE_ISA_ID == 1 || LATTICE_ISA_ID == 0
constexpr int kMaxVectors = 2;
#else
constexpr int kMaxVectors = 4;
#endif

} // namespace mlx_lattice::cpu::LATTICE_ISA::simd
