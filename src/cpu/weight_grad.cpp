#include <algorithm>
#include <vector>

#include "cpu/convert.h"
#include "cpu/kernels.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "threadpool.h"

namespace mlx_lattice::cpu {

namespace {

struct Chunk {
  int64_t k, e0, e1;
};

template <typename T>
void run(const T* x, const T* ct, PairView v, int A, int B, T* out) {
  const int64_t AB = int64_t(A) * B;
  // Edges of each offset are cut into chunks whose size depends only on the
  // problem (never on threads); partial sums are reduced in chunk order.
  const int64_t budget = int64_t(1) << 24; // floats of partial sums
  int64_t chunk = 2048;
  if (v.edges / chunk * AB > budget) {
    chunk = std::max<int64_t>(chunk, v.edges * AB / budget + 1);
  }
  std::vector<Chunk> chunks;
  std::vector<int64_t> first(v.k + 1, 0);
  for (int64_t k = 0; k < v.k; ++k) {
    int64_t b = v.offsets ? v.offsets[k] : 0;
    int64_t e = v.offsets ? v.offsets[k + 1] : v.edges;
    first[k] = static_cast<int64_t>(chunks.size());
    for (int64_t c = b; c < e; c += chunk) {
      chunks.push_back({k, c, std::min(e, c + chunk)});
    }
  }
  first[v.k] = static_cast<int64_t>(chunks.size());
  std::vector<float> partial(chunks.size() * AB);
  parallel_for(
      static_cast<int64_t>(chunks.size()), 1, [&](int64_t c0, int64_t c1) {
        std::vector<float> xbuf(A), cbuf(B);
        for (int64_t c = c0; c < c1; ++c) {
          float* acc = partial.data() + c * AB;
          std::fill(acc, acc + AB, 0.0f);
          for (int64_t e = chunks[c].e0; e < chunks[c].e1; ++e) {
            int64_t g = v.offsets ? v.g[e] : e;
            int64_t r = v.offsets ? v.r[e] : e;
            to_float(x + g * A, xbuf.data(), A);
            to_float(ct + r * B, cbuf.data(), B);
            for (int a = 0; a < A; ++a) {
              const float xa = xbuf[a];
              float* row = acc + int64_t(a) * B;
              for (int b = 0; b < B; ++b) {
                row[b] += xa * cbuf[b];
              }
            }
          }
        }
      });
  parallel_for(v.k * A, 16, [&](int64_t i0, int64_t i1) {
    std::vector<float> sum(B);
    for (int64_t i = i0; i < i1; ++i) {
      int64_t k = i / A, a = i % A;
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t c = first[k]; c < first[k + 1]; ++c) {
        const float* p = partial.data() + c * AB + a * B;
        for (int b = 0; b < B; ++b) {
          sum[b] += p[b];
        }
      }
      from_float(sum.data(), out + i * B, B);
    }
  });
}

} // namespace

void weight_grad(
    const mx::array& x,
    const mx::array& ct,
    PairView view,
    mx::array& out,
    mx::Stream s) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(s);
  enc.set_input_array(x);
  enc.set_input_array(ct);
  enc.set_output_array(out);
  const int A = x.shape(1);
  const int B = ct.shape(1);
  dispatch_float(out.dtype(), [&]<typename T>() {
    enc.dispatch([xp = x.data<T>(),
                  cp = ct.data<T>(),
                  op = out.data<T>(),
                  view,
                  A,
                  B]() { run<T>(xp, cp, view, A, B, op); });
  });
}

} // namespace mlx_lattice::cpu
