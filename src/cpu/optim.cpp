// AdamUpdate on the CPU (core/optim.h): one task over the update's kernel,
// compiled per instruction-set path (src/cpu/adam.cpp).
#include <algorithm>
#include <array>
#include <vector>

#include "core/optim.h"
#include "core/threadpool.h"
#include "cpu/kernels.h"

namespace mlx_lattice {

namespace {

// A float32 input; shape and strides are set only when it is not dense
// (weight gradients usually arrive as transposed views of the convolution's
// kernel-major layout).
struct Strided {
  const float* data = nullptr;
  std::vector<int64_t> shape, strides;

  // Row-major copy into buf: rows of the last dimension in parallel, the
  // dimensions that are contiguous in the source merged first.
  const float* gather(std::vector<float>& buf) const {
    std::vector<int64_t> sh, st;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) {
        continue;
      }
      if (!sh.empty() && st.back() == strides[d] * shape[d]) {
        sh.back() *= shape[d];
        st.back() = strides[d];
      } else {
        sh.push_back(shape[d]);
        st.push_back(strides[d]);
      }
    }
    int64_t n = 1;
    for (auto d : shape) {
      n *= d;
    }
    buf.resize(n);
    if (n == 0) {
      return buf.data();
    }
    if (sh.empty()) {
      std::fill(buf.begin(), buf.end(), data[0]);
      return buf.data();
    }
    const int64_t inner = sh.back(), step = st.back();
    const int64_t rows = n / inner;
    float* out = buf.data();
    const float* src = data;
    parallel_for(rows, std::max<int64_t>(1, 16384 / inner), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        int64_t off = 0, rem = r;
        for (int d = static_cast<int>(sh.size()) - 2; d >= 0; --d) {
          off += (rem % sh[d]) * st[d];
          rem /= sh[d];
        }
        const float* a = src + off;
        float* o = out + r * inner;
        for (int64_t j = 0; j < inner; ++j) {
          o[j] = a[j * step];
        }
      }
    });
    return buf.data();
  }
};

} // namespace

void AdamUpdate::eval_cpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  // Fresh outputs: the inputs of a primitive with several outputs are held
  // by every output, so MLX never reports them donatable here.
  auto& enc = cpu::encode_all(in, out, stream());
  auto dense = [](const mx::array& a) {
    return a.flags().row_contiguous && a.data_size() == a.size();
  };
  // Inputs are taken as they come (no contiguity nodes in the graph); a
  // strided one is gathered into a dense copy when the task runs (its data
  // is ready then). One task runs the parameters' updates in turn, each
  // over the kernel's own threads.
  struct Update {
    std::array<Strided, 4> src;
    int64_t n;
    float *po, *mo, *vo;
  };
  std::vector<Update> updates(count_);
  for (int j = 0; j < count_; ++j) {
    auto& u = updates[j];
    for (int i = 0; i < 4; ++i) {
      const auto& a = in[4 * j + i];
      u.src[i].data = a.data<float>();
      if (!dense(a)) {
        u.src[i].shape.assign(a.shape().begin(), a.shape().end());
        u.src[i].strides.assign(a.strides().begin(), a.strides().end());
      }
    }
    u.n = static_cast<int64_t>(out[3 * j].size());
    u.po = out[3 * j].data<float>();
    u.mo = out[3 * j + 1].data<float>();
    u.vo = out[3 * j + 2].data<float>();
  }
  Strided scalars;
  scalars.data = in.back().data<float>();
  if (!dense(in.back())) {
    scalars.shape.assign(in.back().shape().begin(), in.back().shape().end());
    scalars.strides.assign(in.back().strides().begin(), in.back().strides().end());
  }
  enc.dispatch([fn = cpu::active_kernels().adam_update,
                k = k_,
                updates = std::move(updates),
                scalars = std::move(scalars)]() {
    std::vector<float> sbuf;
    const float* sp = scalars.shape.empty() ? scalars.data : scalars.gather(sbuf);
    std::vector<float> copies[4];
    for (const auto& u : updates) {
      const float* p[4];
      for (int i = 0; i < 4; ++i) {
        p[i] = u.src[i].shape.empty() ? u.src[i].data : u.src[i].gather(copies[i]);
      }
      fn(u.n, k, sp, p[0], p[1], p[2], p[3], u.po, u.mo, u.vo);
    }
  });
}

} // namespace mlx_lattice
