// Conversions between the feature dtypes and float32 accumulators, per
// instruction-set path.
#pragma once

#include "cpu/convert_base.h"
#include "cpu/isa_begin.h"

namespace mlx_lattice::cpu::LATTICE_ISA {

// The portable conversions (cpu/convert_base.h), overloaded below where the
// path has faster ones.
using cpu::from_float;
using cpu::to_float;

#if LATTICE_ISA_ID == 1 || LATTICE_ISA_ID == 2
// Hardware half <-> float conversion (overloads preferred to the templates),
// 8 lanes at a time (round to nearest
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
