#include "metal/map_primitive.h"

#include <cstring>
#include <limits>
#include <stdexcept>

#include "mlx/ops.h"

namespace mlx_lattice::metal {

mx::Shape map_output_shape(const std::string& step, const MapParams& p) {
  auto dim = [&](int64_t n) {
    if (n > std::numeric_limits<int32_t>::max()) {
      throw std::invalid_argument(
          "map step '" + step + "': output of " + std::to_string(n) +
          " elements exceeds an int32 dimension");
    }
    return static_cast<int32_t>(n);
  };
  const int64_t e = p.edges;
  if (step == "table") {
    return {dim(int64_t(p.mask) + 3)};
  }
  if (step == "count") {
    return {dim(int64_t(p.n_out) + 1)};
  }
  if (step == "fill") {
    return {2, dim(e)};
  }
  if (step == "neighbor_map") {
    return {dim(p.n_out), p.kv};
  }
  if (step == "out_idx") {
    return {dim(e)};
  }
  if (step == "kernel_major") {
    return {dim(p.kv + 1 + 3 * e)};
  }
  if (step == "input_major") {
    return {dim(int64_t(p.n_in) + 1 + 3 * e)};
  }
  if (step == "forward_support" || step == "generative_support") {
    return {dim(map_support_words(map_sort_params(p)))};
  }
  if (step == "support_fill") {
    return {dim(e), 4};
  }
  if (step == "sorted_plan") {
    return {dim(map_plan_words(p))};
  }
  map_program(step, p); // raises the unknown-step message
  throw std::logic_error("map step without an output shape: " + step);
}

void MapStep::eval_cpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error(
      "Metal map building runs on a Metal GPU stream; the CPU builds maps "
      "with _ext.build_relation");
}

void MapStep::eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
#ifdef MLX_LATTICE_METAL
  run(map_program(step_, p_), in, out[0], stream());
#else
  (void)in;
  (void)out;
  throw std::runtime_error("mlx_lattice was built without Metal: no Metal map building");
#endif
}

bool MapStep::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const MapStep&>(other);
  return step_ == o.step_ && std::memcmp(&p_, &o.p_, sizeof(MapParams)) == 0;
}

mx::array map_step(
    const std::string& step,
    const std::vector<mx::array>& inputs,
    const MapParams& p,
    mx::Stream s) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].dtype() != mx::int32) {
      throw std::invalid_argument(
          "map step '" + step + "': input " + std::to_string(i) + " must be int32");
    }
  }
  const mx::Shape shape = map_output_shape(step, p);
  std::vector<mx::array> contiguous;
  for (const auto& a : inputs) {
    contiguous.push_back(mx::contiguous(a, false, s));
  }
  return mx::array(shape, mx::int32, std::make_shared<MapStep>(s, step, p), contiguous);
}

} // namespace mlx_lattice::metal
