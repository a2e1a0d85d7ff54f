// Conversions between the feature dtypes and float32 accumulators.
#pragma once

#include <cstdint>

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

// Dispatches fn.template operator()<T>() on the floating dtype of `a`.
template <typename F>
void dispatch_float(mlx::core::Dtype dt, F&& fn) {
  using namespace mlx::core;
  if (dt == float32) {
    fn.template operator()<float>();
  } else if (dt == float16) {
    fn.template operator()<float16_t>();
  } else if (dt == bfloat16) {
    fn.template operator()<bfloat16_t>();
  } else {
    throw std::invalid_argument("features must be float32, float16 or bfloat16");
  }
}

} // namespace mlx_lattice::cpu
