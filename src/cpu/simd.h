// Portable SIMD vectors for the CPU micro-kernels (GCC/Clang vector
// extensions): 16 floats per vector with AVX-512, 8 with AVX, 4 otherwise
// (NEON on Apple Silicon). Multiply-adds contract to FMA where available.
#pragma once

#include <cstring>

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
