// Conversions between the feature dtypes and float32 accumulators.
#pragma once

#include "cpu/isa_begin.h"

namespace mlx_lattice::cpu::LATTICE_ISA {

template <typename T>
inline void to_float(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = static_cast<float>(src[i]);
  }
}

template <typename T>
inline void from_float(const float* src, T* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = static_cast<T>(src[i]);
  }
}

#if LATTICE_ISA_ID == 1 || LATTICE_ISA_ID == 2
// Hardware half <-> float conversion (overloads preferred to the templates
// above), 8 lanes at a time (round to nearest
// even, as MLX's software conversion).
inline void to_float(
    const mlx::core::float16_t* src,
    float* dst,
    int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) {
    dst[i] = static_cast<float>(src[i]);
  }
}

inline void from_float(
    const float* src,
    mlx::core::float16_t* dst,
    int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(
        _mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) {
    dst[i] = static_cast<mlx::core::float16_t>(src[i]);
  }
}
#endif

#if !defined(__ARM_FEATURE_BF16)
// bfloat16 is the upper half of a float32: widen by shifting; narrow with
// round-to-nearest-even (NaN -> canonical quiet NaN), bit for bit as MLX.
inline void to_float(
    const mlx::core::bfloat16_t* src,
    float* dst,
    int64_t n) {
  static_assert(sizeof(mlx::core::bfloat16_t) == 2);
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  uint32_t* d = reinterpret_cast<uint32_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    d[i] = uint32_t(s[i]) << 16;
  }
}

inline void from_float(
    const float* src,
    mlx::core::bfloat16_t* dst,
    int64_t n) {
  const uint32_t* s = reinterpret_cast<const uint32_t*>(src);
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = s[i];
    const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    uint32_t r = (u + ((u >> 16) & 1u) + 0x7FFFu) >> 16;
    d[i] = static_cast<uint16_t>(nan ? 0x7FC0u : r);
  }
}
#endif

// Calls fn.template operator()<T>() for the C++ type of a feature dtype.
template <typename F>
void dispatch_float(Float dt, F&& fn) {
  switch (dt) {
    case Float::f32:
      fn.template operator()<float>();
      break;
    case Float::f16:
      fn.template operator()<mlx::core::float16_t>();
      break;
    case Float::bf16:
      fn.template operator()<mlx::core::bfloat16_t>();
      break;
  }
}

} // namespace mlx_lattice::cpu::LATTICE_ISA
