// PatchAttention and PatchAttentionGrad on the CPU (core/attention.h): the
// tasks of cpu/kernels.cpp over the flash-attention kernels compiled per
// instruction-set path (src/cpu/attention.cpp).
#include "core/attention.h"
#include "cpu/kernels.h"

namespace mlx_lattice {

void PatchAttention::eval_cpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  cpu::patch_attention_forward(
      in[0], in[1], in[2], in[3], scale_, out[0], out[1], stream());
}

void PatchAttentionGrad::eval_cpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  cpu::patch_attention_backward(in, scale_, out, stream());
}

} // namespace mlx_lattice
