// Routes of metal/wgrad_mma.metal: the matrix-unit weight gradient over the
// kernel-major edges, any channels, ungrouped (metal.wgrad_mma) or grouped
// (metal.grouped_wgrad_mma, the same kernels); partitioned over each
// offset's edges and reduced in order by wgrad_reduce (backward.metal) when
// one threadgroup per block of dW would leave the GPU idle.
#include <algorithm>

#include "metal/route.h"

namespace mlx_lattice::metal {

namespace {

constexpr int64_t kEdgesPerPart = 512;      // edges a partition sums, at least
constexpr int64_t kMaxParts = 64;           // partitions per offset, at most
constexpr int64_t kGroupsEnough = 4096;     // threadgroups that fill any Apple GPU
constexpr int64_t kPartialBytes = 64 << 20; // float partials, at most

} // namespace

// Step 1: threadgroup (block, q, k) sums 16-edge chunks q, q + P, ... of
// offset k's edges for a 32 x BN block of one group's dW[k], into dW itself
// (P == 1) or a float partial. Step 2 (P > 1) adds the partials in order.
// dW is (K, A / groups, B): w.a is a group's input channels.
Program wgrad_mma_program(const Call& c, int groups, const std::string& stem) {
  const WeightGradParams w = weight_grad_params(c);
  const bool pointwise = weight_grad_pointwise(c);
  const int bg = w.b / groups;
  const int bn = bg <= 32 ? 32 : 64;
  const int64_t k = std::max(w.k, 1);
  const int64_t blocks =
      int64_t(groups) * int64_t(ceil_div(w.a, 32)) * int64_t(ceil_div(bg, bn));
  const int64_t edges = pointwise ? w.pointwise_rows : c.in[3].shape(0);
  const int64_t per_k = (edges + k - 1) / k;
  int64_t parts = std::clamp<int64_t>((per_k + kEdgesPerPart - 1) / kEdgesPerPart, 1, kMaxParts);
  parts = std::min(parts, std::max<int64_t>(1, kGroupsEnough / (k * blocks)));
  const int64_t elements = k * std::max(w.a, 1) * std::max(w.b, 1);
  parts = std::min(parts, std::max<int64_t>(1, kPartialBytes / (4 * elements)));
  WeightGradMmaParams p{w.k, w.a, w.b, static_cast<int32_t>(parts), w.pointwise_rows, groups};
  Program prog;
  prog.temps.push_back({mx::float32, parts > 1 ? parts * elements : 1});
  Step s;
  s.kernel = stem + "_" + c.dt + "_n" + std::to_string(bn);
  s.threads = {128, 1, 1};
  s.groups = {static_cast<uint64_t>(blocks), static_cast<uint64_t>(parts), offsets_grid(w.k)};
  s.buffers = pair_bindings(pointwise);
  s.buffers.push_back(temp(0, "partials"));
  s.buffers.push_back(output("dw"));
  s.buffers.push_back(bytes(p));
  prog.steps.push_back(s);
  if (parts > 1) {
    prog.steps.push_back(wgrad_reduce_step(c, WeightGradPartsParams{p.k, p.a, p.b, p.parts}));
  }
  return prog;
}

namespace {

Program wgrad_mma(const Call& c) {
  return wgrad_mma_program(c, 1, "wgrad_mma");
}

// x has A channels, dW A / groups rows for the primitive's group count.
Program grouped_wgrad_mma(const Call& c) {
  const GroupedParams g = grouped_params(c.in[0].shape(1), c.out_shape[1], c.out_shape[2], c);
  return wgrad_mma_program(c, g.a / g.ag, "wgrad_mma");
}

} // namespace

const std::vector<Route>& wgrad_mma_routes() {
  static const std::vector<Route> table = {
      {"metal.wgrad_mma", Op::WeightGrad, nullptr, wgrad_mma},
      {"metal.grouped_wgrad_mma", Op::WeightGrad, nullptr, grouped_wgrad_mma, true},
  };
  return table;
}

} // namespace mlx_lattice::metal
