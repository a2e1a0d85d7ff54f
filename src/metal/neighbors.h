// Neighbour queries on the GPU (metal/neighbors.metal): three programs per
// query, in order: the grid over the reference points, the count (CSR
// offsets, scanned) and the fill (neighbour indices and distances). The
// host reads offsets[n_query] between count and fill, the one
// synchronisation (the edge count is unknown before).
#pragma once

#include <string>

#include "metal/program.h"

#include "../../metal/neighbor_params.h"

namespace mlx_lattice::metal {

// The grid and distance mode for one query, from the points themselves
// (bounding box, batch items, integrality): radius > 0 for a radius query
// (k = max_neighbors, 0: all), else a k-nearest query. Points and batches
// as src/cpu/neighbors.h takes them; edges: the count read back before the fill.
NeighborParams neighbor_params(
    const mx::array& queries,
    const mx::array& query_batch,
    const mx::array& points,
    const mx::array& point_batch,
    int k,
    double radius,
    int64_t edges);

// Programs over the inputs (queries, query_batch, points, point_batch,
// grid, offsets):
// "grid": (points, point_batch) -> grid (n_cells + 2 + n_points);
// "knn_count" / "radius_count": -> offsets (n_query + 1), scanned;
// "knn_fill" / "radius_fill": -> edges (2E): indices, then the float bits
// of the distances.
Program neighbor_program(const std::string& step, const NeighborParams& p);

} // namespace mlx_lattice::metal
