// Row conversions between the feature dtypes and float32, portable: no
// instruction-set path (cpu/isa_begin.h) is needed, so code outside the CPU
// kernels (the memory-bound fused norms) uses them directly. The kernels'
// cpu/convert.h adds the F16C half conversions of the AVX2 and AVX-512
// paths on top.
//
// Defined before any target pragma, these inline functions are compiled for
// the baseline wherever an out-of-line copy is emitted; inlined into a path's
// kernel, they vectorize for that path.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "mlx/dtype.h"
#include "mlx/types/bf16.h"
#include "mlx/types/half_types.h"

namespace mlx_lattice::cpu {

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

// Calls fn.template operator()<T>() for the C++ type of a floating dtype.
template <typename F>
void dispatch_float(mlx::core::Dtype dt, F&& fn) {
  // (Qualified: arm_neon.h declares a global float16_t too.)
  using mlx::core::bfloat16;
  using mlx::core::float16;
  using mlx::core::float32;
  if (dt == float32) {
    fn.template operator()<float>();
  } else if (dt == float16) {
    fn.template operator()<mlx::core::float16_t>();
  } else if (dt == bfloat16) {
    fn.template operator()<mlx::core::bfloat16_t>();
  } else {
    throw std::invalid_argument("features must be float32, float16 or bfloat16");
  }
}

} // namespace mlx_lattice::cpu
