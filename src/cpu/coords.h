// Helpers on (N, 4) int32 coordinate arrays, shared by the coordinate table
// and kernel-map building.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mlx/array.h"

namespace mlx_lattice {

namespace mx = mlx::core;

// Raises unless c is a row-contiguous (N, 4) int32 array.
void check_coords(const mx::array& c, const char* name);

// a, evaluated.
mx::array evaluated(const mx::array& a);

// (M, 4) coordinates of packed keys.
mx::array coords_from_keys(const std::vector<uint64_t>& keys);

// "(b, x, y, z)"
std::string tuple4(const int32_t* c);

// Raises: `what` coordinate c lies outside the supported range.
[[noreturn]] void range_error(const int32_t* c, const char* what);

} // namespace mlx_lattice
