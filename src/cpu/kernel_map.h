// The CPU map builder: the coordinate table (coord_table.cpp) and
// kernel-map building (kernel_map.cpp), which make the relations of
// core/relation.h.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/relation.h"
#include "mlx/array.h"

// The coordinate range, key packing and the table hash, shared with the
// Metal and CUDA kernels.
#include "../../metal/lattice_keys.h"

namespace mlx_lattice {

// Open-addressing hash map from packed coordinate to row index.
class CoordTable {
 public:
  // coords: (N, 4) int32, evaluated. Throws std::invalid_argument on
  // out-of-range or duplicate rows.
  explicit CoordTable(const mx::array& coords);

  int64_t size() const {
    return n_;
  }
  const mx::array& coords() const {
    return coords_;
  }
  const int32_t* coord_data() const {
    return coords_.data<int32_t>();
  }
  int32_t find(uint64_t key) const {
    const uint64_t x = key_mix(key);
    if (!may_contain(x, key)) {
      return -1;
    }
    return probe(slot_of(x, key), key);
  }
  // Looks up n keys at once (kEmptyKey queries give -1). Most neighbour
  // candidates are absent: the presence filter (L2-resident) answers them
  // without touching the slots; the rest have their home slots prefetched
  // together before probing, so that their cache misses overlap.
  void find_many(const uint64_t* keys, int n, int32_t* out) const {
    constexpr int kMax = 256;
    uint64_t home[kMax];
    int idx[kMax];
    for (int b = 0; b < n; b += kMax) {
      const int m = std::min(kMax, n - b);
      int cnt = 0;
      for (int i = 0; i < m; ++i) {
        const uint64_t key = keys[b + i];
        const uint64_t x = key_mix(key);
        out[b + i] = -1;
        home[cnt] = slot_of(x, key);
        idx[cnt] = i;
        cnt += (key != kEmptyKey) & may_contain(x, key);
      }
      for (int j = 0; j < cnt; ++j) {
        __builtin_prefetch(&slots_[home[j]]);
      }
      for (int j = 0; j < cnt; ++j) {
        out[b + idx[j]] = probe(home[j], keys[b + idx[j]]);
      }
    }
  }
  // Row index of each query row (-1 where absent); queries (M, 4) int32.
  mx::array lookup(const mx::array& queries) const;

 private:
  // key_hash(key) & mask_, from the key's mix x (the filter reads x too).
  uint64_t slot_of(uint64_t x, uint64_t key) const {
    return ((x << 2) | (key & 3)) & mask_;
  }
  // The filter indexes by the mix's top bits (the slots use its bottom
  // ones), again keeping a z-run of 4 within one byte.
  uint64_t filter_bit(uint64_t x, uint64_t key) const {
    return ((x >> filter_shift_) << 2) | (key & 3);
  }
  bool may_contain(uint64_t x, uint64_t key) const {
    const uint64_t i = filter_bit(x, key);
    return (filter_[i >> 6] >> (i & 63)) & 1;
  }
  int32_t probe(uint64_t h, uint64_t key) const {
    for (;;) {
      const Slot& s = slots_[h];
      if (s.key == key) {
        return s.val;
      }
      if (s.key == kEmptyKey) {
        return -1;
      }
      h = (h + 1) & mask_;
    }
  }
  struct Slot {
    uint64_t key;
    int32_t val;
    int32_t pad;
  };
  mx::array coords_;
  int64_t n_;
  uint64_t mask_;
  std::vector<Slot> slots_; // key and row side by side: one miss per probe
  // Presence filter: one bit per (hashed) key, about 16 bits per row, so
  // that an absent key is usually answered by a clear bit.
  std::vector<uint64_t> filter_;
  int filter_shift_;
};

struct KernelSpec {
  std::array<int, 3> size{1, 1, 1};
  std::array<int, 3> stride{1, 1, 1};
  std::array<int, 3> padding{0, 0, 0};
  std::array<int, 3> dilation{1, 1, 1};
  int volume() const {
    return size[0] * size[1] * size[2];
  }
};

// Whether a kernel's relation of a set onto itself is symmetric: edge
// (q <- p, k) exactly when (p <- q, K - 1 - k). So it is for a centred odd
// kernel at stride 1 in the conv form; every backend's builder asks this.
bool symmetric_geometry(const KernelSpec& spec, bool transposed);

// Output supports.
mx::array forward_support(const CoordTable& in, const KernelSpec& spec);
mx::array generative_support(const CoordTable& in, const KernelSpec& spec);

// Edges for given output coordinates.
//   conv form (transposed=false): in = stride*out - padding + dilation*d
//   transposed form (transposed=true): out = stride*in - padding + dilation*d
// out_table, when given, is a table of exactly out_coords (the same buffer):
// builds that look outputs up use it instead of hashing them again.
std::shared_ptr<Relation> build_relation(
    const CoordTable& in,
    const mx::array& out_coords,
    const KernelSpec& spec,
    bool transposed,
    const std::string& kind,
    const CoordTable* out_table = nullptr);

} // namespace mlx_lattice
