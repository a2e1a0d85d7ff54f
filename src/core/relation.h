// Coordinates, kernel maps and relations: the coordinate table
// (coord_table.cpp), kernel-map building (kernel_map.cpp) and a relation's
// derived views (relation.cpp).
//
// A relation holds the edges (out, in, k) of a sparse convolution as CSR
// arrays sorted by (output row, kernel offset). Input-major and kernel-major
// views and the dense neighbour map are derived lazily and cached.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "mlx/array.h"

// The coordinate range, key packing and the table hash, shared with the
// Metal and CUDA kernels.
#include "../../metal/lattice_keys.h"

namespace mlx_lattice {

namespace mx = mlx::core;

// The two CSR views of a relation: rows are its outputs (the convolution)
// or its inputs (the input gradient, with W transposed per offset).
enum class View : int { OutputMajor = 0, InputMajor = 1 };

inline View flip(View v) {
  return v == View::OutputMajor ? View::InputMajor : View::OutputMajor;
}

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

class Relation {
 public:
  Relation(
      std::string kind,
      int64_t n_in,
      int64_t n_out,
      int64_t k,
      mx::array out_offsets,
      mx::array in_idx,
      mx::array k_idx);

  const std::string& kind() const {
    return kind_;
  }
  int64_t n_in() const {
    return n_in_;
  }
  int64_t n_out() const {
    return n_out_;
  }
  int64_t kernel_volume() const {
    return k_;
  }
  int64_t edges() const {
    return e_;
  }

  const mx::array& out_offsets() const {
    return out_offsets_;
  }
  const mx::array& in_idx() const {
    return in_idx_;
  }
  const mx::array& k_idx() const {
    return k_idx_;
  }
  const mx::array& out_idx(); // (E,) row of each edge, expanded from CSR

  // Input-major view: edges sorted by (in, k). perm maps view -> edge.
  struct InputMajor {
    mx::array offsets, perm, out_idx, k_idx;
  };
  const InputMajor& input_major();

  // Kernel-major view: edges sorted by (k, out). perm maps view -> edge.
  struct KernelMajor {
    mx::array offsets, perm, in_idx, out_idx;
  };
  const KernelMajor& kernel_major();

  // A view's edges grouped by kernel offset, for the CPU gather-GEMM: the
  // edges of offset k are rows / gather [segments[2k], segments[2k + 1]),
  // rows ascending (rows and gather as in the CSR view of `v`). The output
  // view's is the kernel-major view itself; a symmetric relation's input
  // view is the same arrays with offset k read from segment K - 1 - k; any
  // other input view is the input-major view stably sorted by offset.
  struct OffsetGroups {
    mx::array segments, rows, gather;
  };
  const OffsetGroups& offset_groups(View v);

  // (N_out, K) int32, -1 where no input.
  const mx::array& neighbor_map();
  // Provides the neighbour map when the builder already made it.
  void set_neighbor_map(mx::array nmap);
  // (N_in, K) int32: the output row of edge (in, k), -1 where none (the
  // neighbour map of the input-major view; dense-channel input gradients).
  const mx::array& input_neighbor_map();

  // Rows ordered by neighbour bitmask (stable), for implicit-GEMM routes.
  // reorder_rows[i] is the output row at sorted position i; out_in_map is
  // the neighbour map in sorted order, kv_out_in_map its (K, N_out)
  // transpose; tile_masks ORs the masks of each `tile` sorted rows.
  static constexpr int kPlanTile = 64;
  struct SortedPlan {
    mx::array reorder_rows, out_in_map, kv_out_in_map, tile_masks;
  };
  const SortedPlan& sorted_plan();

  // The rows of a view (output rows, or input rows for the input-major
  // view) stably sorted by the set of kernel offsets their edges have, for
  // the matrix-unit CSR routes (a tile of consecutive positions multiplies
  // the union of its rows' offsets). The key is the 64-bit mask of offsets;
  // past 64 offsets, offset k sets bit k * 64 / K (neighbouring offsets
  // share a bit; rows with the same offsets still share a key). Where
  // K <= 64 the output-major order equals the sorted plan's reorder_rows
  // (same key, same stable sort) but is made from the CSR alone. A GPU
  // builder provides both for K <= 64 (set_row_order); the others are made
  // here from the CSR views, once.
  const mx::array& row_order(View v);

  // Per output row counts: max and mean neighbours.
  int64_t max_neighbors() const;

  // The same edges with input and output roles exchanged.
  std::shared_ptr<Relation> swapped(const std::string& kind);

  // Views made by a GPU builder (mlx_lattice/metal_maps.py), used instead of
  // deriving them here. They may be unevaluated: the primitives take them as
  // inputs, and nothing here reads them once provided. A view already built
  // or provided is kept.
  void set_out_idx(mx::array out_idx);
  void set_kernel_major(KernelMajor view);
  void set_input_major(InputMajor view);
  void set_input_neighbor_map(mx::array map);
  void set_sorted_plan(SortedPlan plan);
  void set_row_order(View v, mx::array order);
  // Marks a relation of a set onto itself whose edges pair up: (q <- p, k)
  // exactly when (p <- q, K - 1 - k) (a centred odd kernel at stride 1).
  // Its input-major view is then its own CSR mirrored, with no sort.
  void set_symmetric() {
    symmetric_ = true;
  }

 private:
  std::string kind_;
  int64_t n_in_, n_out_, k_, e_;
  mx::array out_offsets_, in_idx_, k_idx_;
  std::once_flag out_once_, in_once_, k_once_, nmap_once_, plan_once_, in_nmap_once_;
  std::once_flag groups_once_[2], order_once_[2];
  std::optional<SortedPlan> plan_;
  std::optional<mx::array> out_idx_, nmap_, in_nmap_;
  std::optional<InputMajor> in_view_;
  std::optional<KernelMajor> k_view_;
  std::optional<OffsetGroups> groups_[2];
  std::optional<mx::array> order_[2];
  bool symmetric_ = false;

  InputMajor mirrored_input_major();
  OffsetGroups input_offset_groups();
};

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

mx::array make_int32(int64_t n);

} // namespace mlx_lattice
