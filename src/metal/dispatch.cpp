#include "metal/dispatch.h"

#include <stdexcept>

#include <algorithm>

namespace mlx_lattice::metal {

namespace {

constexpr uint64_t kChannelTile = 32;
constexpr uint64_t kRowTile = 8;

uint64_t ceil_div(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
}

} // namespace

// One thread per (row, output channel): rows of 8 x 32 channels per group.
Plan plan_gather_conv(const std::string& dtype, int64_t rows, int a, int b) {
  (void)a;
  Plan p;
  p.kernel = "gather_conv_" + dtype;
  p.threads = {kChannelTile, kRowTile, 1};
  p.groups = {
      ceil_div(std::max(b, 1), kChannelTile),
      ceil_div(std::max<int64_t>(rows, 1), kRowTile),
      1};
  p.buffers = {"x", "w", "offsets", "gather", "k", "y", "params"};
  return p;
}

// One thread per (offset, input channel, output channel).
Plan plan_weight_grad(const std::string& dtype, int64_t k, int a, int b) {
  Plan p;
  p.kernel = "weight_grad_" + dtype;
  p.threads = {kChannelTile, kRowTile, 1};
  p.groups = {
      ceil_div(std::max(b, 1), kChannelTile),
      ceil_div(std::max(a, 1), kRowTile),
      static_cast<uint64_t>(std::max<int64_t>(k, 1))};
  p.buffers = {"x", "ct", "offsets", "g", "r", "dw", "params"};
  return p;
}

} // namespace mlx_lattice::metal
