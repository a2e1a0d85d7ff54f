// Portable SIMD vectors for the CPU micro-kernels (GCC/Clang vector
// extensions): 16 floats per vector with AVX-512, 8 with AVX, 4 otherwise
// (NEON on Apple Silicon). Multiply-adds contract to FMA where available.
#pragma once

#include <cstring>

#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

namespace mlx_lattice::cpu::simd {

#if defined(__AVX512F__)
constexpr int kWidth = 16;
constexpr int kRegisters = 32;
#elif defined(__AVX__)
constexpr int kWidth = 8;
constexpr int kRegisters = 16;
#else
constexpr int kWidth = 4;
constexpr int kRegisters = 32;
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
#if defined(__AVX512F__)
  return reinterpret_cast<vec>(_mm512_broadcastss_ps(_mm_load_ss(p)));
#elif defined(__AVX__)
  return reinterpret_cast<vec>(_mm256_broadcast_ss(p));
#else
  return vec{} + *p;
#endif
}

inline vec zero() {
  return vec{};
}

// Rows of an MR x (NV vectors) register tile such that the accumulators, one
// weight row and a broadcast fit in the register file.
constexpr int rows_for(int nv) {
  int mr = (kRegisters - nv - 2) / nv;
  return mr > 14 ? 14 : (mr < 1 ? 1 : mr);
}

// Widest register tile in vectors (a column block is kMaxVectors * kWidth).
#if defined(__AVX__) && !defined(__AVX512F__)
constexpr int kMaxVectors = 2;
#else
constexpr int kMaxVectors = 4;
#endif

} // namespace mlx_lattice::cpu::simd
