// The feature dtypes every backend's kernels take.
#pragma once

#include "mlx/dtype.h"

namespace mlx_lattice {

inline bool is_feature_dtype(mlx::core::Dtype dt) {
  return dt == mlx::core::float32 || dt == mlx::core::float16 || dt == mlx::core::bfloat16;
}

} // namespace mlx_lattice
