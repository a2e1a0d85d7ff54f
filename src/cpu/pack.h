// Packing helpers shared by the CPU convolution kernels.
#pragma once

#include "cpu/isa_begin.h"

#include "cpu/convert.h"
#include "cpu/simd.h"

namespace mlx_lattice::cpu::LATTICE_ISA {

inline int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

// Bytes of one core's L2 cache as the system reports it; 0 where it does
// not (the kernels then size their blocks for 512 KiB).
inline int64_t l2_cache_bytes() {
  static const int64_t bytes = [] {
    int64_t v = 0;
#if defined(__linux__) && defined(_SC_LEVEL2_CACHE_SIZE)
    v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#elif defined(__APPLE__)
    size_t n = sizeof(v);
    if (sysctlbyname("hw.perflevel0.l2cachesize", &v, &n, nullptr, 0) != 0) {
      v = 0;
    }
#endif
    return v > 0 ? v : int64_t(0);
  }();
  return bytes;
}

// Column blocks of a padded width: full blocks of kMaxVectors vectors, then
// one narrower block. Returns (first column, vectors) pairs.
inline std::vector<std::pair<int, int>> column_blocks(int padded) {
  constexpr int full = simd::kMaxVectors * simd::kWidth;
  std::vector<std::pair<int, int>> blocks;
  for (int c = 0; c < padded; c += full) {
    blocks.push_back({c, std::min(full, padded - c) / simd::kWidth});
  }
  return blocks;
}

// Calls fn.template operator()<NV>() for a column block of nv vectors.
template <typename F>
inline void dispatch_vectors(int nv, F&& fn) {
  switch (nv) {
    case 1:
      fn.template operator()<1>();
      break;
    case 2:
      fn.template operator()<2>();
      break;
    case 3:
      if constexpr (simd::kMaxVectors >= 3) {
        fn.template operator()<3>();
      }
      break;
    default:
      if constexpr (simd::kMaxVectors >= 4) {
        fn.template operator()<4>();
      }
      break;
  }
}

// W (K, A, B), read through its element strides `ws` -> float32
// [block][k][a][block width], zero-padded columns. Values are copied, so the
// layout changes no result. A weight contiguous along B is widened a row
// (one a) at a time; any other, such as the (C_out, Kx, Ky, Kz, C_in)
// parameter read in place, a column (one b, every a) at a time.
template <typename T>
std::vector<float> pack_weights(const T* w, WeightStrides ws, int64_t K, int A, int B) {
  const int bp = static_cast<int>(round_up(B, simd::kWidth));
  std::vector<float> out(K * A * bp, 0.0f);
  auto blocks = column_blocks(bp);
  // Block of column c: its first column and width.
  std::vector<std::pair<int, int>> block_of(B);
  for (auto [c0, nv] : blocks) {
    for (int c = c0; c < std::min(B, c0 + nv * simd::kWidth); ++c) {
      block_of[c] = {c0, nv * simd::kWidth};
    }
  }
  parallel_for(K, 1, [&](int64_t k0, int64_t k1) {
    std::vector<T> gathered(std::max(A, B));
    std::vector<float> line(std::max(A, B));
    // Widens n elements at p with stride s (vectorized for half types when s = 1).
    auto widen = [&](const T* p, int64_t s, int n) {
      const T* src = p;
      if (s != 1) {
        for (int i = 0; i < n; ++i) {
          gathered[i] = p[i * s];
        }
        src = gathered.data();
      }
      to_float(src, line.data(), n);
    };
    for (int64_t k = k0; k < k1; ++k) {
      if (ws.b == 1) {
        for (int a = 0; a < A; ++a) {
          widen(w + k * ws.k + a * ws.a, 1, B);
          for (auto [c0, nv] : blocks) {
            const int width = nv * simd::kWidth;
            float* dst = out.data() + (int64_t(c0) * K + k * width) * A + int64_t(a) * width;
            std::copy(line.begin() + c0, line.begin() + std::min(B, c0 + width), dst);
          }
        }
      } else {
        for (int b = 0; b < B; ++b) {
          widen(w + k * ws.k + b * ws.b, ws.a, A);
          auto [c0, width] = block_of[b];
          float* dst = out.data() + (int64_t(c0) * K + k * width) * A + (b - c0);
          for (int a = 0; a < A; ++a) {
            dst[int64_t(a) * width] = line[a];
          }
        }
      }
    }
  });
  return out;
}

// Affine-quantized weights in MLX's packing (codes along C_in, `32 / bits`
// per uint32, lowest bits first; one scale and bias per group of C_in), with
// logical shape (C_out, K, C_in) -> the pack_weights layout in float32.
template <typename S>
std::vector<float> pack_quantized_weights(
    const uint32_t* codes,
    const S* scales,
    const S* biases,
    int bits,
    int group,
    int64_t K,
    int A,
    int B) {
  const int bp = static_cast<int>(round_up(B, simd::kWidth));
  std::vector<float> out(K * A * bp, 0.0f);
  auto blocks = column_blocks(bp);
  const int per_word = 32 / bits;
  const uint32_t mask = (uint32_t(1) << bits) - 1;
  const int64_t words_per_row = A / per_word;
  const int64_t groups_per_row = A / group;
  parallel_for(K, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      for (int co = 0; co < B; ++co) {
        const int64_t row = int64_t(co) * K + k; // (C_out, K) row of C_in values
        const uint32_t* cw = codes + row * words_per_row;
        const S* sc = scales + row * groups_per_row;
        const S* bi = biases + row * groups_per_row;
        int c0 = 0, width = 0;
        for (auto [b0, nv] : blocks) {
          if (co >= b0 && co < b0 + nv * simd::kWidth) {
            c0 = b0;
            width = nv * simd::kWidth;
          }
        }
        float* dst = out.data() + (int64_t(c0) * K + k * width) * A + (co - c0);
        for (int a = 0; a < A; ++a) {
          const uint32_t q = (cw[a / per_word] >> ((a % per_word) * bits)) & mask;
          const float s = static_cast<float>(sc[a / group]);
          const float b = static_cast<float>(bi[a / group]);
          // product and sum rounded apart on every path (no simd::fma): the
          // same weights whichever path runs
          dst[int64_t(a) * width] = s * static_cast<float>(q) + b;
        }
      }
    }
  });
  return out;
}

// Offset of block (c0, width) for offset k in a pack_weights buffer.
inline const float*
packed_block(const float* packed, int64_t K, int A, int c0, int width, int64_t k) {
  return packed + (int64_t(c0) * K + k * width) * A;
}

// A float32 view of rows of x: the array itself, or a converted copy.
// Uninitialised float scratch for large temporaries: huge-page backed where
// the system allows, so that filling it does not fault on every 4 KiB page.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    std::free(data_);
  }
  float* get(int64_t n) {
    if (n > size_) {
      std::free(data_);
      constexpr size_t kAlign = size_t(1) << 21;
      const size_t bytes = (size_t(std::max<int64_t>(n, 1)) * sizeof(float) + kAlign - 1) / kAlign * kAlign;
      data_ = static_cast<float*>(std::aligned_alloc(kAlign, bytes));
      if (!data_) {
        throw std::bad_alloc();
      }
#if defined(MADV_HUGEPAGE)
      madvise(data_, bytes, MADV_HUGEPAGE);
#endif
      size_ = n;
    }
    return data_;
  }

 private:
  float* data_ = nullptr;
  int64_t size_ = 0;
};

template <typename T>
const float* float_rows(const T* x, int64_t n, int64_t cols, Scratch& buf) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    float* out = buf.get(n * cols);
    parallel_for(n, 4096, [&](int64_t r0, int64_t r1) {
      to_float(x + r0 * cols, out + r0 * cols, (r1 - r0) * cols);
    });
    return out;
  }
}

} // namespace mlx_lattice::cpu::LATTICE_ISA
