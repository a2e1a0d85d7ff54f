// What the binding files share: the type casters (every file converts with
// the same set), one init_* per area adding that area's names to the module
// (module.cpp calls them in order), and the ops' stream argument.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>

#include "mlx/stream.h"
#include "mlx/utils.h"

namespace mlx_lattice {

namespace mx = mlx::core;
namespace nb = nanobind;

void init_cpu(nb::module_& m);
void init_maps(nb::module_& m);
void init_conv(nb::module_& m);
void init_autodiff(nb::module_& m);
void init_norm(nb::module_& m);
void init_feature_ops(nb::module_& m);
void init_optim(nb::module_& m);
void init_attention(nb::module_& m);
void init_neighbors(nb::module_& m);
void init_metal(nb::module_& m);

// The text of metal/lattice_keys.h, embedded at build time (CMakeLists.txt).
const char* lattice_keys_source();

// An op's `stream` argument: MLX's default stream when None.
inline mx::Stream stream_or_default(std::optional<mx::Stream> s) {
  return s ? *s : mx::to_stream(mx::StreamOrDevice{});
}

} // namespace mlx_lattice
