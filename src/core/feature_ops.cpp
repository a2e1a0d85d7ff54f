// The primitives of feature_ops.h and their CPU tasks (plain loops: both are
// bound by memory bandwidth, so one build serves every instruction set).
#include "core/feature_ops.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "core/threadpool.h"
#include "cpu/kernels.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"

namespace mlx_lattice {

namespace {

// Rows per task: about 64k elements, so a task streams a few hundred KB.
int64_t row_grain(int64_t C) {
  return std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(C, 1));
}

void check_features(const mx::array& a, const char* op, const char* what) {
  if (a.ndim() != 2) {
    throw std::invalid_argument(
        std::string(op) + ": " + what + " must be an (N, C) array, got " + std::to_string(a.ndim()) +
        " dimensions");
  }
}

// A strided (N, C) view of an evaluated array, in elements.
template <typename T>
struct Rows {
  const T* p;
  int64_t s0, s1;
  const T* row(int64_t i) const {
    return p + i * s0;
  }
};

template <typename T>
Rows<T> rows_of(const mx::array& a) {
  return {a.data<T>(), int64_t(a.strides()[0]), int64_t(a.strides()[1])};
}

// out = a + b row by row; float16 / bfloat16 add in float32 and round once,
// which is what MLX's CPU Add does (and exact rounding of the sum: float32
// holds more than twice their precision).
template <typename T>
void sum_rows(Rows<T> a, Rows<T> b, T* out, int64_t N, int64_t C) {
  parallel_for(N, row_grain(C), [=](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const T* __restrict x = a.row(i);
      const T* __restrict y = b.row(i);
      T* o = out + i * C;
      if (a.s1 == 1 && b.s1 == 1) {
        for (int64_t c = 0; c < C; ++c) {
          if constexpr (std::is_same_v<T, float>) {
            o[c] = x[c] + y[c];
          } else {
            o[c] = T(static_cast<float>(x[c]) + static_cast<float>(y[c]));
          }
        }
      } else {
        for (int64_t c = 0; c < C; ++c) {
          if constexpr (std::is_same_v<T, float>) {
            o[c] = x[c * a.s1] + y[c * b.s1];
          } else {
            o[c] = T(static_cast<float>(x[c * a.s1]) + static_cast<float>(y[c * b.s1]));
          }
        }
      }
    }
  });
}

template <typename F>
void dispatch(mx::Dtype t, F&& fn) {
  if (t == mx::float32) {
    fn.template operator()<float>();
  } else if (t == mx::float16) {
    fn.template operator()<mx::float16_t>();
  } else if (t == mx::bfloat16) {
    fn.template operator()<mx::bfloat16_t>();
  } else {
    throw std::invalid_argument("feature ops: features must be float32, float16 or bfloat16");
  }
}

std::runtime_error cpu_only(const char* op) {
  return std::runtime_error(std::string(op) + ": a CPU primitive (GPU streams use MLX's ops)");
}

} // namespace

// ---------------------------------------------------------------- Fork

void Fork::eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
  for (auto& o : out) {
    o.copy_shared_buffer(in[0]);
  }
}

void Fork::eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
  eval_cpu(in, out);
}

std::vector<mx::array> Fork::vjp(
    const std::vector<mx::array>&,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>&,
    const std::vector<mx::array>&) {
  return {cotangent_sum(cotangents[0], cotangents[1], stream())};
}

std::vector<mx::array> Fork::jvp(
    const std::vector<mx::array>&,
    const std::vector<mx::array>& tangents,
    const std::vector<int>&) {
  return {tangents[0], tangents[0]};
}

std::vector<mx::Shape> Fork::output_shapes(const std::vector<mx::array>& in) {
  return {in[0].shape(), in[0].shape()};
}

std::vector<mx::array> fork(const mx::array& x, mx::Stream s) {
  return mx::array::make_arrays(
      {x.shape(), x.shape()}, {x.dtype(), x.dtype()}, std::make_shared<Fork>(s), {x});
}

// ---------------------------------------------------------------- CotangentSum

void CotangentSum::eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
  auto& enc = mx::cpu::get_command_encoder(stream());
  const auto& a = in[0];
  const auto& b = in[1];
  auto& o = out[0];
  // Written in place over an input nothing else holds, as MLX's Add does.
  if (a.is_donatable() && a.flags().row_contiguous && a.itemsize() == o.itemsize()) {
    o.copy_shared_buffer(a);
  } else if (b.is_donatable() && b.flags().row_contiguous && b.itemsize() == o.itemsize()) {
    o.copy_shared_buffer(b);
  } else {
    o.set_data(mx::allocator::malloc(o.nbytes()));
  }
  enc.set_input_array(a);
  enc.set_input_array(b);
  enc.set_output_array(o);
  const int64_t N = o.shape(0), C = o.shape(1);
  dispatch(o.dtype(), [&]<typename T>() {
    enc.dispatch([ra = rows_of<T>(a), rb = rows_of<T>(b), op = o.data<T>(), N, C]() {
      sum_rows<T>(ra, rb, op, N, C);
    });
  });
}

void CotangentSum::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw cpu_only("cotangent_sum");
}

std::vector<mx::array> CotangentSum::vjp(
    const std::vector<mx::array>&,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>& argnums,
    const std::vector<mx::array>&) {
  return std::vector<mx::array>(argnums.size(), cotangents[0]);
}

std::vector<mx::array> CotangentSum::jvp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& tangents,
    const std::vector<int>& argnums) {
  if (argnums.size() == 2) {
    return {cotangent_sum(tangents[0], tangents[1], stream())};
  }
  return {tangents[0]};
}

std::vector<mx::Shape> CotangentSum::output_shapes(const std::vector<mx::array>& in) {
  return {in[0].shape()};
}

mx::array cotangent_sum(const mx::array& a, const mx::array& b, mx::Stream s) {
  if (s.device != mx::Device::cpu) {
    return mx::add(a, b, s);
  }
  check_features(a, "cotangent_sum", "a");
  check_features(b, "cotangent_sum", "b");
  if (a.shape() != b.shape() || a.dtype() != b.dtype() || !cpu::is_feature_dtype(a.dtype())) {
    throw std::invalid_argument(
        "cotangent_sum: a and b must have one shape and one floating dtype (float32, float16, bfloat16)");
  }
  return mx::array(a.shape(), a.dtype(), std::make_shared<CotangentSum>(s), {a, b});
}

// ---------------------------------------------------------------- ConcatColumns

void ConcatColumns::eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
  auto& enc = cpu::encode_all(in, out, stream());
  const int64_t N = out[0].shape(0), C = out[0].shape(1);
  dispatch(out[0].dtype(), [&]<typename T>() {
    std::vector<Rows<T>> parts;
    std::vector<int64_t> widths;
    for (const auto& a : in) {
      parts.push_back(rows_of<T>(a));
      widths.push_back(a.shape(1));
    }
    enc.dispatch([parts = std::move(parts), widths = std::move(widths), op = out[0].data<T>(), N, C]() {
      parallel_for(N, row_grain(C), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          T* o = op + i * C;
          for (size_t k = 0; k < parts.size(); ++k) {
            const T* x = parts[k].row(i);
            const int64_t w = widths[k], s1 = parts[k].s1;
            if (s1 == 1) {
              std::memcpy(o, x, w * sizeof(T));
            } else {
              for (int64_t c = 0; c < w; ++c) {
                o[c] = x[c * s1];
              }
            }
            o += w;
          }
        }
      });
    });
  });
}

void ConcatColumns::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw cpu_only("concat_columns");
}

std::vector<mx::array> ConcatColumns::vjp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>& argnums,
    const std::vector<mx::array>&) {
  std::vector<int> start(primals.size() + 1, 0);
  for (size_t k = 0; k < primals.size(); ++k) {
    start[k + 1] = start[k] + primals[k].shape(1);
  }
  const int N = cotangents[0].shape(0);
  std::vector<mx::array> grads;
  for (int k : argnums) {
    grads.push_back(mx::slice(cotangents[0], {0, start[k]}, {N, start[k + 1]}, stream()));
  }
  return grads;
}

std::vector<mx::array> ConcatColumns::jvp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& tangents,
    const std::vector<int>& argnums) {
  std::vector<mx::array> parts;
  for (size_t k = 0; k < primals.size(); ++k) {
    parts.push_back(mx::zeros_like(primals[k], stream()));
  }
  for (size_t j = 0; j < argnums.size(); ++j) {
    parts[argnums[j]] = tangents[j];
  }
  return {concat_columns(parts, stream())};
}

std::vector<mx::Shape> ConcatColumns::output_shapes(const std::vector<mx::array>& in) {
  int C = 0;
  for (const auto& a : in) {
    C += a.shape(1);
  }
  return {{in[0].shape(0), C}};
}

mx::array concat_columns(const std::vector<mx::array>& xs, mx::Stream s) {
  if (xs.empty()) {
    throw std::invalid_argument("concat_columns: needs at least one array");
  }
  int C = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    check_features(xs[k], "concat_columns", "every array");
    if (xs[k].shape(0) != xs[0].shape(0) || xs[k].dtype() != xs[0].dtype()) {
      throw std::invalid_argument("concat_columns: arrays must have one row count and one dtype");
    }
    C += xs[k].shape(1);
  }
  if (!cpu::is_feature_dtype(xs[0].dtype())) {
    throw std::invalid_argument("concat_columns: arrays must be float32, float16 or bfloat16");
  }
  if (s.device != mx::Device::cpu) {
    return mx::concatenate(xs, 1, s);
  }
  return mx::array({xs[0].shape(0), C}, xs[0].dtype(), std::make_shared<ConcatColumns>(s), xs);
}

} // namespace mlx_lattice
