// Single-kernel dispatch plans of the relation-traversal kernels (kernel,
// grid, threadgroup, buffer names), as encoded by metal/program.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlx/stream.h"

namespace mlx_lattice::metal {

namespace mx = mlx::core;

struct Plan {
  std::string kernel;
  std::array<uint64_t, 3> groups{1, 1, 1};  // threadgroups per grid
  std::array<uint64_t, 3> threads{1, 1, 1}; // threads per threadgroup
  std::vector<std::string> buffers;         // names by buffer index
};

Plan plan_gather_conv(const std::string& dtype, int64_t rows, int a, int b);
Plan plan_weight_grad(const std::string& dtype, int64_t k, int a, int b);

} // namespace mlx_lattice::metal
