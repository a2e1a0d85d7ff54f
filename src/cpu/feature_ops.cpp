// Fork, CotangentSum and ConcatColumns on the CPU (core/feature_ops.h):
// plain loops over the thread pool (both are bound by memory bandwidth, so
// one build serves every instruction set).
#include <cstring>
#include <stdexcept>

#include "core/feature_ops.h"
#include "core/threadpool.h"
#include "cpu/kernels.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlx_lattice {

namespace {

// Rows per task: about 64k elements, so a task streams a few hundred KB.
int64_t row_grain(int64_t C) {
  return std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(C, 1));
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

} // namespace

// ---------------------------------------------------------------- Fork

void Fork::eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
  for (auto& o : out) {
    o.copy_shared_buffer(in[0]);
  }
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

} // namespace mlx_lattice
