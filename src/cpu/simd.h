// Portable SIMD vectors for the CPU micro-kernels (GCC/Clang vector
// extensions), sized by the instruction-set path being compiled (see
// cpu/isa_begin.h): 16 floats per vector with AVX-512, 8 with AVX2, 4 on the
// x86-64 baseline (SSE2) and NEON. Multiply-adds contract to FMA where the
// path has it (AVX2, AVX-512, NEON; not the x86-64 baseline).
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
