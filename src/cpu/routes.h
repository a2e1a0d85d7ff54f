// CPU route table: one entry per CPU route of mlx_lattice/routes.py, keyed by
// its name; eval_cpu runs the entry of the primitive's route.
#pragma once

#include <string>
#include <vector>

#include "core/relation.h"
#include "core/route_op.h"
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
  // Arrays appended after the view's (offsets, gather, k), for that view;
  // nullptr: none.
  std::vector<mx::array> (*extra_inputs)(Relation& rel, View view) = nullptr;
};

const std::vector<Route>& routes();

// The entry of `name`, which must be a CPU route of `op`.
const Route& find(const std::string& name, Op op);

// Arrays route `name` reads besides the view's (none without a relation).
std::vector<mx::array> extra_inputs(
    const std::string& name,
    Op op,
    const std::shared_ptr<Relation>& rel,
    View view);

} // namespace mlx_lattice::cpu
