// Multithreaded CPU primitives for the plumbing between layers, where MLX's
// own ops run on one thread: a tensor shared by two layers (Fork, whose
// backward pass sums both cotangents in one pass) and a channel
// concatenation (ConcatColumns). Every result is bitwise what MLX's ops give
// (a + b, concatenate); features are (N, C) arrays of any strides.
#pragma once

#include <vector>

#include "core/primitive_decl.h"
#include "mlx/primitives.h"

namespace mlx_lattice {

namespace mx = mlx::core;

// Two outputs sharing x's buffer. Each feeds one layer, so MLX never sums
// their cotangents itself: the vjp sums them with CotangentSum (on the
// CPU; elsewhere with mx::add).
class Fork : public mx::Primitive {
 public:
  explicit Fork(mx::Stream s) : mx::Primitive(s) {}

  LATTICE_EVAL()
  LATTICE_VJP()
  LATTICE_JVP()
  LATTICE_OUTPUT_SHAPES()
  LATTICE_NAME("SparseFork")
  LATTICE_ALWAYS_EQUIVALENT()
};

// a + b for two (N, C) arrays of one floating dtype and any strides, written
// to dense rows (into a donated input where MLX allows). CPU only.
class CotangentSum : public mx::Primitive {
 public:
  explicit CotangentSum(mx::Stream s) : mx::Primitive(s) {}

  LATTICE_EVAL()
  LATTICE_VJP()
  LATTICE_JVP()
  LATTICE_OUTPUT_SHAPES()
  LATTICE_NAME("SparseCotangentSum")
  LATTICE_ALWAYS_EQUIVALENT()
};

// Columns of (N, C_i) arrays of one dtype, any strides, side by side in one
// dense (N, sum C_i) array. Its vjp slices the cotangent (as MLX's
// Concatenate does). CPU only.
class ConcatColumns : public mx::Primitive {
 public:
  explicit ConcatColumns(mx::Stream s) : mx::Primitive(s) {}

  LATTICE_EVAL()
  LATTICE_VJP()
  LATTICE_JVP()
  LATTICE_OUTPUT_SHAPES()
  LATTICE_NAME("SparseConcatColumns")
  LATTICE_ALWAYS_EQUIVALENT()
};

// (x, x) as two arrays that share x's buffer (see Fork).
std::vector<mx::array> fork(const mx::array& x, mx::Stream s);

// a + b (see CotangentSum); on a GPU stream mx::add.
mx::array cotangent_sum(const mx::array& a, const mx::array& b, mx::Stream s);

// The columns of xs side by side (see ConcatColumns).
mx::array concat_columns(const std::vector<mx::array>& xs, mx::Stream s);

} // namespace mlx_lattice
