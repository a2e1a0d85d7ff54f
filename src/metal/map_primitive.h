// Map building at run time on a Metal GPU: one primitive per program of
// src/metal/map_build.cpp. Sizes are decided on the host, so each map is a
// sequence of these arrays with one read-back between count and fill (the
// caller's, mlx_lattice/backends/metal/maps.py); eval_gpu encodes the
// step's program exactly as the test harness runs it.
#pragma once

#include <string>
#include <vector>

#include "metal/map_build.h"
#include "mlx/primitives.h"

namespace mlx_lattice::metal {

// The output shape (int32) of a map step (see map_program).
mx::Shape map_output_shape(const std::string& step, const MapParams& p);

class MapStep : public mx::Primitive {
 public:
  MapStep(mx::Stream s, std::string step, const MapParams& p)
      : mx::Primitive(s), step_(std::move(step)), p_(p) {}

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out)
      override;
  void eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out)
      override;
  bool is_equivalent(const mx::Primitive& other) const override;
  const char* name() const override {
    return "MetalMapStep";
  }

 private:
  std::string step_;
  MapParams p_;
};

// The int32 array of one step over `inputs` (int32, contiguous) on stream s.
mx::array map_step(
    const std::string& step,
    const std::vector<mx::array>& inputs,
    const MapParams& p,
    mx::Stream s);

} // namespace mlx_lattice::metal
