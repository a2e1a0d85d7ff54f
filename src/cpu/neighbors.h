// Neighbour queries between point sets: k nearest and fixed radius.
//
// Points are (N, 3) float32 with an (N,) int32 batch index; a query only
// sees reference points of its own batch item. Results are CSR relations
// (offsets (M + 1) int32, indices (E) int32, distances (E) float32), each
// query's neighbours sorted by (distance, index). Distances are computed in
// double from the float32 coordinates, so ties and the radius boundary do
// not depend on the thread count or the search order.
#pragma once

#include <tuple>

#include "mlx/array.h"

namespace mlx_lattice {

namespace mx = mlx::core;

using NeighborCSR = std::tuple<mx::array, mx::array, mx::array>;

// The k nearest reference points of each query (fewer when its batch item
// holds fewer than k points).
NeighborCSR knn_query(
    const mx::array& queries,
    const mx::array& query_batch,
    const mx::array& points,
    const mx::array& point_batch,
    int k);

// Every reference point within `radius` (inclusive) of each query; with
// max_neighbors > 0 only the nearest max_neighbors of them.
NeighborCSR radius_query(
    const mx::array& queries,
    const mx::array& query_batch,
    const mx::array& points,
    const mx::array& point_batch,
    double radius,
    int max_neighbors);

} // namespace mlx_lattice
