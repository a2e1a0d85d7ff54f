// eval_gpu of the primitives with no GPU program: Fork shares its input's
// buffer on any device; the others run on the CPU only (on a GPU stream
// their callers use MLX's ops) and raise.
#include <stdexcept>
#include <string>

#include "core/attention.h"
#include "core/feature_ops.h"
#include "core/norm.h"
#include "core/optim.h"

namespace mlx_lattice {

namespace {

std::runtime_error cpu_only(const char* op) {
  return std::runtime_error(std::string(op) + ": a CPU primitive (GPU streams use MLX's ops)");
}

} // namespace

void Fork::eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
  eval_cpu(in, out);
}

void CotangentSum::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw cpu_only("cotangent_sum");
}

void ConcatColumns::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw cpu_only("concat_columns");
}

void RunningStats::eval_gpu(
    const std::vector<mx::array>&,
    std::vector<mx::array>&) {
  throw cpu_only("running_stats");
}

void AdamUpdate::eval_gpu(
    const std::vector<mx::array>&,
    std::vector<mx::array>&) {
  throw std::runtime_error(
      "adam_update runs on the CPU only (on a GPU the optimizer uses MLX ops)");
}

void PatchAttention::eval_gpu(
    const std::vector<mx::array>&,
    std::vector<mx::array>&) {
  throw std::runtime_error(
      "PatchAttention runs on the CPU only; use "
      "mx.fast.scaled_dot_product_attention on the GPU");
}

void PatchAttentionGrad::eval_gpu(
    const std::vector<mx::array>&,
    std::vector<mx::array>&) {
  throw std::runtime_error("PatchAttentionGrad runs on the CPU only");
}

} // namespace mlx_lattice
