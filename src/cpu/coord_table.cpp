// The coordinate table: a hash table from packed coordinates to rows.
#include <algorithm>
#include <stdexcept>

#include "cpu/coords.h"
#include "cpu/kernel_map.h"
#include "core/threadpool.h"
#include "mlx/allocator.h"

namespace mlx_lattice {

namespace {

uint64_t next_pow2(uint64_t v) {
  uint64_t p = 16;
  while (p < v) {
    p <<= 1;
  }
  return p;
}

} // namespace

void check_coords(const mx::array& c, const char* name) {
  if (c.ndim() != 2 || c.shape(1) != 4 || c.dtype() != mx::int32) {
    throw std::invalid_argument(
        std::string(name) + " must be an (N, 4) int32 array");
  }
  if (c.size() > 0 && !c.flags().row_contiguous) {
    throw std::invalid_argument(std::string(name) + " must be row-contiguous");
  }
}

mx::array evaluated(const mx::array& a) {
  mx::array b = a;
  b.eval();
  return b;
}

mx::array coords_from_keys(const std::vector<uint64_t>& keys) {
  int64_t m = static_cast<int64_t>(keys.size());
  mx::array out(
      mx::allocator::malloc(std::max<int64_t>(m, 1) * 4 * sizeof(int32_t)),
      {static_cast<int>(m), 4},
      mx::int32);
  int32_t* p = out.data<int32_t>();
  parallel_for(m, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int32_t* c = p + 4 * i;
      c[0] = unpack_batch(keys[i]);
      for (int a = 0; a < 3; ++a) {
        c[a + 1] = unpack_axis(keys[i], a);
      }
    }
  });
  return out;
}

// Messages are built with std::to_string, not iostreams: formatting numbers
// through a stream crashed an extension built against MLX's CUDA wheel,
// whose link gave the module its own copy of the C++ runtime.
std::string tuple4(const int32_t* c) {
  return "(" + std::to_string(c[0]) + ", " + std::to_string(c[1]) + ", " +
      std::to_string(c[2]) + ", " + std::to_string(c[3]) + ")";
}

[[noreturn]] void range_error(const int32_t* c, const char* what) {
  throw std::invalid_argument(
      std::string(what) + " coordinate " + tuple4(c) +
      " leaves the supported range: batch in [0, " + std::to_string(kBatchLimit) +
      "), x/y/z in [" + std::to_string(kCoordMin) + ", " +
      std::to_string(kCoordMax) + "]");
}

CoordTable::CoordTable(const mx::array& coords) : coords_(evaluated(coords)) {
  check_coords(coords_, "coords");
  n_ = coords_.shape(0);
  uint64_t cap = next_pow2(2 * static_cast<uint64_t>(std::max<int64_t>(n_, 8)));
  mask_ = cap - 1;
  slots_.assign(cap, Slot{kEmptyKey, -1, 0});
  const uint64_t fbits = next_pow2(16 * static_cast<uint64_t>(std::max<int64_t>(n_, 8)));
  filter_.assign(fbits / 64, 0);
  filter_shift_ = 64 - (__builtin_ctzll(fbits) - 2);
  const int32_t* c = n_ > 0 ? coords_.data<int32_t>() : nullptr;
  for (int64_t i = 0; i < n_; ++i) {
    const int32_t* r = c + 4 * i;
    if (!in_range(r[0], r[1], r[2], r[3])) {
      range_error(r, "input");
    }
    uint64_t key = pack_key(r[0], r[1], r[2], r[3]);
    uint64_t h = key_hash(key) & mask_;
    while (slots_[h].key != kEmptyKey) {
      if (slots_[h].key == key) {
        throw std::invalid_argument(
            "coords contain duplicate rows " + std::to_string(slots_[h].val) +
            " and " + std::to_string(i) + " at " + tuple4(r) +
            "; merge duplicates with mlx_lattice.sparse_quantize first");
      }
      h = (h + 1) & mask_;
    }
    slots_[h] = Slot{key, static_cast<int32_t>(i), 0};
    const uint64_t f = filter_bit(key_mix(key), key);
    filter_[f >> 6] |= uint64_t(1) << (f & 63);
  }
}

mx::array CoordTable::lookup(const mx::array& queries_in) const {
  mx::array queries = evaluated(queries_in);
  check_coords(queries, "queries");
  int64_t m = queries.shape(0);
  mx::array out = make_int32(m);
  int32_t* o = out.data<int32_t>();
  const int32_t* q = m > 0 ? queries.data<int32_t>() : nullptr;
  parallel_for(m, kRowGrain, [&](int64_t b, int64_t e) {
    constexpr int kGroup = 256;
    uint64_t keys[kGroup];
    for (int64_t i0 = b; i0 < e; i0 += kGroup) {
      const int rows = static_cast<int>(std::min<int64_t>(kGroup, e - i0));
      for (int i = 0; i < rows; ++i) {
        const int32_t* r = q + 4 * (i0 + i);
        keys[i] = in_range(r[0], r[1], r[2], r[3])
            ? pack_key(r[0], r[1], r[2], r[3])
            : kEmptyKey;
      }
      find_many(keys, rows, o + i0);
    }
  });
  return out;
}

} // namespace mlx_lattice
