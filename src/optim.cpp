// The fused Adam / AdamW update: the primitive. Its CPU kernel is compiled
// per instruction-set path (src/cpu/adam.cpp).
#include "optim.h"

#include <array>
#include <stdexcept>
#include <string>

#include "cpu/kernels.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"

namespace mlx_lattice {

namespace {

// A float32 input; shape and strides are set only when it is not dense.
struct Strided {
  const float* data = nullptr;
  std::vector<int64_t> shape, strides;

  // Row-major copy into buf.
  const float* gather(std::vector<float>& buf) const {
    int64_t n = 1;
    for (auto d : shape) {
      n *= d;
    }
    buf.resize(n);
    std::vector<int64_t> idx(shape.size(), 0);
    for (int64_t e = 0; e < n; ++e) {
      int64_t off = 0;
      for (size_t d = 0; d < shape.size(); ++d) {
        off += idx[d] * strides[d];
      }
      buf[e] = data[off];
      for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
        if (++idx[d] < shape[d]) {
          break;
        }
        idx[d] = 0;
      }
    }
    return buf.data();
  }
};

} // namespace

void AdamUpdate::eval_cpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  auto& enc = mx::cpu::get_command_encoder(stream());
  auto dense = [](const mx::array& a) {
    return a.flags().row_contiguous && a.data_size() == a.size();
  };
  // Inputs are taken as they come (no contiguity nodes in the graph: one
  // update per parameter per step); a strided one is gathered into a dense
  // copy when the task runs (its data is ready then).
  std::array<Strided, 5> src;
  for (int i = 0; i < 5; ++i) {
    enc.set_input_array(in[i]);
    src[i].data = in[i].data<float>();
    if (!dense(in[i])) {
      src[i].shape.assign(in[i].shape().begin(), in[i].shape().end());
      src[i].strides.assign(in[i].strides().begin(), in[i].strides().end());
    }
  }
  // The parameter and the moments are usually dropped once updated: write
  // in place when nothing else holds them (elementwise, so aliasing is safe).
  for (int i = 0; i < 3; ++i) {
    const auto& a = in[i + 1];
    if (a.is_donatable() && dense(a)) {
      out[i].copy_shared_buffer(a);
    } else {
      out[i].set_data(mx::allocator::malloc(out[i].nbytes()));
    }
    enc.set_output_array(out[i]);
  }
  enc.dispatch([fn = cpu::active_kernels().adam_update,
                n = static_cast<int64_t>(out[0].size()),
                k = k_,
                src = std::move(src),
                po = out[0].data<float>(),
                mo = out[1].data<float>(),
                vo = out[2].data<float>()]() {
    std::vector<float> copies[5];
    const float* p[5];
    for (int i = 0; i < 5; ++i) {
      p[i] = src[i].shape.empty() ? src[i].data : src[i].gather(copies[i]);
    }
    fn(n, k, p[4], p[0], p[1], p[2], p[3], po, mo, vo);
  });
}

void AdamUpdate::eval_gpu(
    const std::vector<mx::array>&,
    std::vector<mx::array>&) {
  throw std::runtime_error(
      "adam_update runs on the CPU only (on a GPU the optimizer uses MLX ops)");
}

std::vector<mx::Shape> AdamUpdate::output_shapes(
    const std::vector<mx::array>& in) {
  return {in[1].shape(), in[1].shape(), in[1].shape()};
}

bool AdamUpdate::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const AdamUpdate&>(other).k_;
  return o.b1 == k_.b1 && o.one_minus_b1 == k_.one_minus_b1 && o.b2 == k_.b2 &&
      o.one_minus_b2 == k_.one_minus_b2 && o.eps == k_.eps &&
      o.bias_correction == k_.bias_correction &&
      o.decoupled_decay == k_.decoupled_decay;
}

std::vector<mx::array> adam_update(
    const mx::array& gradient,
    const mx::array& parameter,
    const mx::array& m,
    const mx::array& v,
    const mx::array& scalars,
    cpu::AdamCoefficients k,
    mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s);
  const std::pair<const char*, const mx::array*> arrays[] = {
      {"gradient", &gradient}, {"parameter", &parameter}, {"m", &m}, {"v", &v}};
  for (auto [what, a] : arrays) {
    if (a->dtype() != mx::float32) {
      throw std::invalid_argument(
          std::string("adam_update: ") + what + " must be float32");
    }
    if (a->shape() != parameter.shape()) {
      throw std::invalid_argument(
          std::string("adam_update: ") + what +
          " must have the parameter's shape");
    }
  }
  if (scalars.dtype() != mx::float32 || scalars.ndim() != 1 ||
      scalars.shape(0) != 3) {
    throw std::invalid_argument("adam_update: scalars must be float32 of shape (3,)");
  }
  std::vector<mx::array> in = {gradient, parameter, m, v, scalars};
  return mx::array::make_arrays(
      {parameter.shape(), parameter.shape(), parameter.shape()},
      {mx::float32, mx::float32, mx::float32},
      std::make_shared<AdamUpdate>(stream, k),
      in);
}

} // namespace mlx_lattice
