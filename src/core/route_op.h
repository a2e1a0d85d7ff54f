// The primitives a route can run under; each backend's route table keys its
// entries by route name and says which of these runs them.
#pragma once

namespace mlx_lattice {

enum class Op { Conv, WeightGrad, QuantizedConv };

inline const char* op_name(Op op) {
  switch (op) {
    case Op::Conv:
      return "conv";
    case Op::WeightGrad:
      return "weight_grad";
    case Op::QuantizedConv:
      return "quantized";
  }
  return "?";
}

} // namespace mlx_lattice
