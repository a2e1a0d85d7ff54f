#include "core/sort.h"

#include <algorithm>
#include <numeric>

#include "core/threadpool.h"

// kEmptyKey, the packed key no coordinate has
#include "../../metal/lattice_keys.h"

namespace mlx_lattice {

namespace {

// LSD radix sort of a range on 16-bit digits; digits on which all keys agree
// are skipped.
void radix_sort(uint64_t* keys, uint64_t* tmp, size_t n) {
  std::vector<uint32_t> count(1 << 16);
  for (int shift = 0; shift < 64; shift += 16) {
    std::fill(count.begin(), count.end(), 0);
    for (size_t i = 0; i < n; ++i) {
      ++count[(keys[i] >> shift) & 0xFFFF];
    }
    if (n == 0 || count[(keys[0] >> shift) & 0xFFFF] == n) {
      continue;
    }
    uint32_t sum = 0;
    for (auto& c : count) {
      uint32_t v = c;
      c = sum;
      sum += v;
    }
    for (size_t i = 0; i < n; ++i) {
      tmp[count[(keys[i] >> shift) & 0xFFFF]++] = keys[i];
    }
    std::copy(tmp, tmp + n, keys);
  }
}

} // namespace

// Unique sorted keys without kEmptyKey entries. Fixed parts (independent of
// the thread count) are deduplicated and sorted in parallel, then merged
// pairwise; the result is the same for any number of threads.
void sort_unique(std::vector<uint64_t>& keys) {
  constexpr int64_t kParts = 8;
  const int64_t n = static_cast<int64_t>(keys.size());
  std::vector<int64_t> bound(kParts + 1);
  for (int64_t p = 0; p <= kParts; ++p) {
    bound[p] = n * p / kParts;
  }
  std::vector<uint64_t> tmp(keys.size());
  std::vector<int64_t> len(kParts);
  parallel_for(kParts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      uint64_t* k = keys.data() + bound[p];
      const int64_t m = bound[p + 1] - bound[p];
      radix_sort(k, tmp.data() + bound[p], m);
      int64_t u = 0;
      for (int64_t i = 0; i < m; ++i) {
        if (k[i] != kEmptyKey && (u == 0 || k[u - 1] != k[i])) {
          k[u++] = k[i];
        }
      }
      len[p] = u;
    }
  });
  // Pairwise merges of the deduplicated runs: 8 -> 4 -> 2 -> 1.
  for (int64_t width = 1; width < kParts; width *= 2) {
    const int64_t pairs = kParts / (2 * width);
    parallel_for(pairs, 1, [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t a = 2 * width * q, b = a + width;
        uint64_t* a0 = keys.data() + bound[a];
        uint64_t* b0 = keys.data() + bound[b];
        uint64_t* out = tmp.data() + bound[a];
        uint64_t* end = std::set_union(a0, a0 + len[a], b0, b0 + len[b], out);
        len[a] = end - out;
        std::copy(out, end, a0);
      }
    });
  }
  keys.resize(len[0]);
}

} // namespace mlx_lattice
