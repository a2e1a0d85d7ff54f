// Metal dispatch plans: which kernel, threadgroup grid and threadgroup size a
// primitive uses. eval_gpu and the test harness both read them from here.
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

// Parameters passed at the last buffer index (layout shared with the .metal).
struct GatherConvParams {
  int32_t rows;
  int32_t a;
  int32_t b;
  int32_t identity;
};

struct WeightGradParams {
  int32_t k;
  int32_t a;
  int32_t b;
  int32_t pointwise_rows; // rows of a pointwise product; -1 with a relation
};

std::string type_name(mx::Dtype dt);

Plan plan_gather_conv(const std::string& dtype, int64_t rows, int a, int b);
Plan plan_weight_grad(const std::string& dtype, int64_t k, int a, int b);

// True when this build can run Metal kernels.
bool available();

void gather_conv(
    const std::vector<mx::array>& in,
    mx::array& out,
    const std::string& route,
    bool has_relation,
    mx::Stream s);

void weight_grad(
    const std::vector<mx::array>& in,
    mx::array& out,
    bool has_relation,
    mx::Stream s);

} // namespace mlx_lattice::metal
