// Neighbour queries on the GPU (metal/neighbors.metal), the routes
// metal.knn and metal.radius: three programs per query, in order: the grid
// over the reference points, the count (CSR offsets, scanned) and the fill
// (neighbour indices and distances). Each runs as an array of the
// MetalNeighborStep primitive; the host reads the edge count back between
// count and fill, the one synchronisation (mlx_lattice/backends/metal/neighbors.py).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "metal/program.h"
#include "mlx/primitives.h"

#include "../../metal/neighbor_params.h"

namespace mlx_lattice::metal {

// Most reference points: the grid buffer (at most 2N cells, 2 words, the
// N-point order) must stay within an int32 dimension.
constexpr int64_t kNeighborMaxPoints = int64_t(1) << 28;
// Most queries (int32 offsets, one thread each).
constexpr int64_t kNeighborMaxQueries = int64_t(1) << 30;

// The grid and distance mode for one query, from the points themselves
// (bounding box, batch items, integrality): radius > 0 for a radius query
// (k = max_neighbors, 0: all), else a k-nearest query. Points and batches
// as src/cpu/neighbors.h takes them.
NeighborParams neighbor_params(
    const mx::array& queries,
    const mx::array& query_batch,
    const mx::array& points,
    const mx::array& point_batch,
    int k,
    double radius);

// The program of one step of `route` ("metal.knn" or "metal.radius", which
// must match the parameters' kind) over the inputs (queries, query_batch,
// points, point_batch, grid, offsets), the first four for "grid", five for
// "count", all six for "fill":
// "grid" -> grid (n_cells + 2 + n_points);
// "count" -> offsets (n_query + 1), scanned;
// "fill" -> indices (E) int32 and distances (E) float32.
Program neighbor_program(const std::string& route, const std::string& step, const NeighborParams& p);

// The step's outputs (shape, dtype); edges: E, the count read back (fill).
std::vector<std::pair<mx::Shape, mx::Dtype>> neighbor_outputs(
    const std::string& route,
    const std::string& step,
    const NeighborParams& p,
    int64_t edges);

class NeighborStep : public mx::Primitive {
 public:
  NeighborStep(mx::Stream s, std::string route, std::string step, const NeighborParams& p)
      : mx::Primitive(s), route_(std::move(route)), step_(std::move(step)), p_(p) {}

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) override;
  void eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) override;
  bool is_equivalent(const mx::Primitive& other) const override;
  const char* name() const override {
    return "MetalNeighborStep";
  }

 private:
  std::string route_;
  std::string step_;
  NeighborParams p_;
};

// The outputs of one step over `inputs` (checked against the parameters)
// on stream s; edges as neighbor_outputs.
std::vector<mx::array> neighbor_step(
    const std::string& route,
    const std::string& step,
    const std::vector<mx::array>& inputs,
    const NeighborParams& p,
    int64_t edges,
    mx::Stream s);

} // namespace mlx_lattice::metal
