// CPU route table: one entry per CPU route of mlx_lattice/routes.py, keyed by
// its name; eval_cpu runs the entry of the primitive's route.
#pragma once

#include <string>
#include <vector>

#include "core/relation.h"
#include "core/route_table.h"
#include "mlx/array.h"
#include "mlx/stream.h"

namespace mlx_lattice::cpu {

namespace mx = mlx::core;

// A primitive's inputs and output, as eval_cpu receives them.
struct Call {
  const std::string& route;
  const std::vector<mx::array>& in;
  mx::array& out;
  mx::Stream stream;
  bool relation; // false: a pointwise product (no view arrays)
  int bits = 0;  // quantized weights: code width and group size
  int group = 0;
  int groups = 1; // channel groups of a grouped product
};

struct Route {
  const char* name;
  Op op; // the primitive that runs it
  void (*run)(const Call& call);
  ExtraInputs extra_inputs = nullptr; // nullptr: none
  bool grouped = false; // see RouteEntry::grouped
};

const std::vector<Route>& routes();

// The entry of `name`, which must be a CPU route of `op`.
const Route& find(const std::string& name, Op op);

// Registers the table with the primitives' (core/route_table.h).
void register_routes();

} // namespace mlx_lattice::cpu
