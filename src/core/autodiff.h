// The autodiff of the extension's differentiable primitives (GatherConv,
// WeightGrad, QuantizedConv, NormAct) is mlx_lattice/autodiff.py's, one text
// for every backend. A primitive's vjp and jvp hand themselves to that
// module's `primitive_rule` through `autodiff_rule`, which the Python
// bindings define (src/bindings/autodiff.cpp, importing the module by name
// on first use): nothing is installed at import, and each primitive stays
// one graph node (no custom function around it).
#pragma once

#include <vector>

#include "mlx/array.h"
#include "mlx/primitives.h"

namespace mlx_lattice {

namespace mx = mlx::core;

struct RuleCall {
  bool reverse;                           // vjp (seeds: cotangents) or jvp (seeds: tangents)
  mx::Primitive& primitive;               // read by the rule for what it carries
  const std::vector<mx::array>& primals;  // the primitive's inputs
  std::vector<mx::array> seeds;           // vjp: every output's cotangent; jvp: argnums' tangents
  std::vector<int> argnums;               // inputs the transform asks for
  std::vector<mx::array> outputs;         // the outputs (a jvp's: remade where the rule reads them)
};

// For a vjp, one gradient per argnum; for a jvp, one tangent per output.
std::vector<mx::array> autodiff_rule(const RuleCall& call);

} // namespace mlx_lattice
