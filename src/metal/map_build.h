// Map building on the GPU (metal/map_build.metal): the three programs of
// one map, in order: the table, the count (offsets), the fill (edges). The
// host reads offsets[n_out] and the table's two flag words between count
// and fill, the map's one synchronisation (edge count unknown before). An
// output support is two programs with the same synchronisation between
// them (its row count and error word).
#pragma once

#include <array>

#include "metal/program.h"

namespace mlx_lattice::metal {

// One map: n_in input rows (the table), n_out output rows (the relation).
MapParams map_params(
    int64_t n_in,
    int64_t n_out,
    const std::array<int, 3>& size,
    const std::array<int, 3>& stride,
    const std::array<int, 3>& padding,
    const std::array<int, 3>& dilation,
    bool transposed,
    int64_t edges);

// map_scan (one threadgroup): words 1..p.n_out of output `name` scanned in
// place into row offsets. Shared with the neighbour programs (neighbors.cpp).
Step map_scan_step(const MapParams& p, const char* name);

// Slots of the table for n rows (the CPU table's capacity: a power of two,
// at least 2n and 16); the table buffer holds two flag words more.
int64_t map_table_slots(int64_t n);

// (in_coords) -> table (slots + 2): the slots' rows, then the smallest
// duplicate row and the smallest out-of-range row (INT32_MAX: none).
Program map_table_program(const MapParams& p);
// (in_coords, table, out_coords) -> offsets (n_out + 1), scanned.
Program map_count_program(const MapParams& p);
// (in_coords, table, out_coords, offsets) -> edges (2, E): input rows,
// then kernel offsets, output-major in offset order.
Program map_fill_program(const MapParams& p);

// Views of a built relation (out_offsets, in_idx, k_idx; p.edges = E):
// -> the neighbour map (n_out, K) of input rows, -1 where none.
Program map_neighbor_map_program(const MapParams& p);
// -> out_idx (E): the output row of each edge.
Program map_out_idx_program(const MapParams& p);
// -> the kernel-major view as one int32 buffer (K + 1 + 3E): offsets per
// kernel offset, then perm (CSR edge), in and out rows, edges stably
// sorted by offset (src/core/relation.cpp).
Program map_kernel_major_program(const MapParams& p);

// -> the input-major view as one int32 buffer (n_in + 1 + 3E): offsets per
// input row, then perm, out rows and kernel offsets, edges ordered by
// (in, k) (src/core/relation.cpp); output coordinates must be unique.
Program map_input_major_program(const MapParams& p);

// Output supports: the candidate keys of n_in rows (n_in * K of them),
// padded to a power of two of at least count + 1 and MAP_SORT_BLOCK.
MapSortParams map_sort_params(const MapParams& p);
// Words of the support buffer: offsets (count + 1), the error word, then
// three words per padded candidate (key high, key low, index).
int64_t map_support_words(const MapSortParams& s);
// (in_coords) -> the support buffer: keys sorted, offsets[count] the
// output rows, the error word the smallest input row reaching outside the
// coordinate range (INT32_MAX: none). generative: outputs s*c - p + dil*d,
// otherwise (c + p - dil*d) / s where divisible (forward).
Program map_support_program(const MapParams& p, bool generative);
// (support buffer) -> the output coordinates (rows, 4), sorted by key.
Program map_support_fill_program(const MapParams& p);

// The sorted plan of n_out rows with kernel volume K <= 64 (the CPU's
// Relation::sorted_plan): (neighbour map (n_out, K)) -> one int32 buffer of
// map_plan_words: the tile masks (uint64 per MAP_PLAN_TILE rows, first so
// that they are 8-byte aligned), reorder rows (n_out), the sorted
// neighbour map (n_out, K), its transpose (K, n_out).
int64_t map_plan_words(const MapParams& p);
Program map_plan_program(const MapParams& p);

// "table", "count", "fill", "neighbor_map", "out_idx", "kernel_major",
// "input_major",
// "forward_support", "generative_support", "support_fill" or "sorted_plan".
Program map_program(const std::string& step, const MapParams& p);

} // namespace mlx_lattice::metal
