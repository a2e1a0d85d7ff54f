#include <algorithm>
#include <vector>

#include "cpu/convert.h"
#include "cpu/kernels.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "threadpool.h"

namespace mlx_lattice::cpu {

namespace {

// acc[0:B] += xa * w[0:B] over the input channels of one edge.
inline void accumulate_edge(
    const float* xr,
    const float* wk,
    float* acc,
    int A,
    int B) {
  for (int a = 0; a < A; ++a) {
    const float xa = xr[a];
    const float* wr = wk + int64_t(a) * B;
    for (int b = 0; b < B; ++b) {
      acc[b] += xa * wr[b];
    }
  }
}

template <typename T>
void run(
    const T* x,
    const T* w,
    CsrView v,
    int64_t K,
    int A,
    int B,
    T* y) {
  // Weights are read once per edge: keep a float32 copy for narrow dtypes.
  std::vector<float> wbuf;
  const float* wf;
  if constexpr (std::is_same_v<T, float>) {
    wf = w;
  } else {
    wbuf.resize(K * A * B);
    to_float(w, wbuf.data(), K * A * B);
    wf = wbuf.data();
  }
  const double avg = v.rows > 0 && v.offsets
      ? double(v.edges) / double(v.rows)
      : 1.0;
  const double row_cost = std::max(1.0, avg) * A * B;
  const int64_t grain =
      std::clamp<int64_t>(int64_t((1 << 18) / row_cost), 8, 4096);
  parallel_for(v.rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> acc(B), xbuf(A);
    for (int64_t r = r0; r < r1; ++r) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      int64_t e0 = v.offsets ? v.offsets[r] : r;
      int64_t e1 = v.offsets ? v.offsets[r + 1] : r + 1;
      for (int64_t e = e0; e < e1; ++e) {
        int64_t g = v.offsets ? v.gather[e] : r;
        int64_t k = v.offsets ? v.k[e] : 0;
        const float* xr;
        if constexpr (std::is_same_v<T, float>) {
          xr = x + g * A;
        } else {
          to_float(x + g * A, xbuf.data(), A);
          xr = xbuf.data();
        }
        accumulate_edge(xr, wf + k * A * B, acc.data(), A, B);
      }
      from_float(acc.data(), y + r * B, B);
    }
  });
}

} // namespace

void gather_conv(
    const mx::array& x,
    const mx::array& w,
    CsrView view,
    mx::array& out,
    mx::Stream s) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(s);
  enc.set_input_array(x);
  enc.set_input_array(w);
  enc.set_output_array(out);
  const int A = x.shape(1);
  const int B = w.shape(2);
  const int64_t K = w.shape(0);
  dispatch_float(out.dtype(), [&]<typename T>() {
    enc.dispatch([xp = x.data<T>(),
                  wp = w.data<T>(),
                  yp = out.data<T>(),
                  view,
                  K,
                  A,
                  B]() { run<T>(xp, wp, view, K, A, B, yp); });
  });
}

} // namespace mlx_lattice::cpu
