// Patch attention: the primitives apart from their evaluation (the op's
// checks, the autodiff rules). eval_cpu is in src/cpu/patch_attention.cpp,
// over the kernels of src/cpu/attention.cpp.
#include "core/attention.h"

#include <stdexcept>
#include <string>

#include "core/dtypes.h"
#include "mlx/ops.h"

namespace mlx_lattice {

namespace {

mx::array contiguous(const mx::array& a, const mx::Stream& s) {
  return mx::contiguous(a, false, s);
}

} // namespace

std::vector<mx::array> patch_attention(
    const mx::array& q,
    const mx::array& k,
    const mx::array& v,
    const mx::array& lengths,
    float scale,
    mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s);
  if (stream.device != mx::Device::cpu) {
    throw std::invalid_argument(
        "patch_attention: runs on a CPU stream (use "
        "mx.fast.scaled_dot_product_attention on the GPU)");
  }
  if (q.ndim() != 4 || k.shape() != q.shape() || v.shape() != q.shape()) {
    throw std::invalid_argument(
        "patch_attention: q, k and v must share one shape (patches, heads, P, D)");
  }
  if (!is_feature_dtype(q.dtype()) || k.dtype() != q.dtype() || v.dtype() != q.dtype()) {
    throw std::invalid_argument(
        "patch_attention: q, k and v must share a float32, float16 or bfloat16 dtype");
  }
  if (lengths.ndim() != 1 || lengths.shape(0) != q.shape(0)) {
    throw std::invalid_argument("patch_attention: lengths must have shape (patches,)");
  }
  const mx::Shape lse_shape{q.shape(0), q.shape(1), q.shape(2)};
  return mx::array::make_arrays(
      {q.shape(), lse_shape},
      {q.dtype(), mx::float32},
      std::make_shared<PatchAttention>(stream, scale),
      {q, k, v, contiguous(mx::astype(lengths, mx::int32, stream), stream)});
}

std::vector<mx::array> PatchAttention::jvp(
    const std::vector<mx::array>&,
    const std::vector<mx::array>&,
    const std::vector<int>&) {
  throw std::invalid_argument(
      "PatchAttention has no forward-mode derivative (jvp); use mx.grad / mx.vjp");
}

std::vector<mx::array> PatchAttention::vjp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>& argnums,
    const std::vector<mx::array>& outputs) {
  auto s = stream();
  const auto& q = primals[0];
  std::vector<mx::array> in(primals.begin(), primals.begin() + 4);
  in.push_back(outputs[0]);
  in.push_back(outputs[1]);
  in.push_back(mx::astype(cotangents[0], q.dtype(), s));
  in.push_back(
      cotangents.size() > 1
          ? contiguous(mx::astype(cotangents[1], mx::float32, s), s)
          : mx::zeros_like(outputs[1], s));
  auto grads = mx::array::make_arrays(
      {q.shape(), q.shape(), q.shape()},
      {q.dtype(), q.dtype(), q.dtype()},
      std::make_shared<PatchAttentionGrad>(s, scale_),
      in);
  std::vector<mx::array> result;
  for (int arg : argnums) {
    if (arg < 3) {
      result.push_back(grads[arg]);
    } else {
      result.push_back(mx::zeros_like(primals[arg], s));
    }
  }
  return result;
}

std::vector<mx::Shape> PatchAttention::output_shapes(
    const std::vector<mx::array>& in) {
  const auto& q = in[0];
  return {q.shape(), {q.shape(0), q.shape(1), q.shape(2)}};
}

bool PatchAttention::is_equivalent(const mx::Primitive& other) const {
  return scale_ == static_cast<const PatchAttention&>(other).scale_;
}

std::vector<mx::array> PatchAttentionGrad::jvp(
    const std::vector<mx::array>&,
    const std::vector<mx::array>&,
    const std::vector<int>&) {
  throw std::invalid_argument(
      "PatchAttentionGrad has no forward-mode derivative (jvp)");
}

std::vector<mx::array> PatchAttentionGrad::vjp(
    const std::vector<mx::array>&,
    const std::vector<mx::array>&,
    const std::vector<int>&,
    const std::vector<mx::array>&) {
  throw std::invalid_argument(
      "PatchAttention supports first derivatives only (no gradient of its gradient)");
}

std::vector<mx::Shape> PatchAttentionGrad::output_shapes(
    const std::vector<mx::array>& in) {
  return {in[0].shape(), in[0].shape(), in[0].shape()};
}

bool PatchAttentionGrad::is_equivalent(const mx::Primitive& other) const {
  return scale_ == static_cast<const PatchAttentionGrad&>(other).scale_;
}

} // namespace mlx_lattice
