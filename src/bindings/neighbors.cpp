// Neighbour queries on the CPU: k nearest and fixed radius.
#include "bindings/bindings.h"
#include "cpu/neighbors.h"

using namespace nanobind::literals;

namespace mlx_lattice {

void init_neighbors(nb::module_& m) {
  m.def(
      "knn_query",
      [](const mx::array& q, const mx::array& qb, const mx::array& p,
         const mx::array& pb, int k) {
        nb::gil_scoped_release release;
        return knn_query(q, qb, p, pb, k);
      },
      "queries"_a, "query_batch"_a, "points"_a, "point_batch"_a, "k"_a);
  m.def(
      "radius_query",
      [](const mx::array& q, const mx::array& qb, const mx::array& p,
         const mx::array& pb, double r, int max_neighbors) {
        nb::gil_scoped_release release;
        return radius_query(q, qb, p, pb, r, max_neighbors);
      },
      "queries"_a, "query_batch"_a, "points"_a, "point_batch"_a, "radius"_a,
      "max_neighbors"_a);
}

} // namespace mlx_lattice
