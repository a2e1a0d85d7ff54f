// Relations and their derived views (relation.cpp); the CPU builds them
// with src/cpu/kernel_map.h, a GPU builder provides them.
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

namespace mlx_lattice {

namespace mx = mlx::core;

// The two CSR views of a relation: rows are its outputs (the convolution)
// or its inputs (the input gradient, with W transposed per offset).
enum class View : int { OutputMajor = 0, InputMajor = 1 };

inline View flip(View v) {
  return v == View::OutputMajor ? View::InputMajor : View::OutputMajor;
}

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
  // Whether the neighbour map is made (by the builder or a reader).
  bool has_neighbor_map() const {
    return nmap_.has_value();
  }
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

  // Views made by a GPU builder (mlx_lattice/backends/metal/maps.py), used
  // instead of deriving them here. They may be unevaluated: the primitives
  // take them as inputs, and nothing here reads them once provided. A view
  // already built or provided is kept.
  void set_out_idx(mx::array out_idx);
  void set_kernel_major(KernelMajor view);
  void set_input_major(InputMajor view);
  void set_input_neighbor_map(mx::array map);
  void set_sorted_plan(SortedPlan plan);
  void set_row_order(View v, mx::array order);
  // Marks a relation of a set onto itself whose edges pair up: (q <- p, k)
  // exactly when (p <- q, K - 1 - k) (a centred odd kernel at stride 1;
  // every backend's builder marks it). Its input-major view is then its own
  // CSR mirrored, with no sort, and gather_conv reads it mirrored as that.
  void set_symmetric() {
    symmetric_ = true;
  }
  bool symmetric() const {
    return symmetric_;
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

// An uninitialised int32 array of n elements (one at least allocated).
mx::array make_int32(int64_t n);
// An uninitialised (rows, cols) int32 array (a neighbour map's shape).
mx::array make_int32(int64_t rows, int64_t cols);

} // namespace mlx_lattice
