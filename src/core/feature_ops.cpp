// The primitives of feature_ops.h apart from their evaluation: the ops'
// checks and the autodiff rules. eval_cpu is in src/cpu/feature_ops.cpp,
// eval_gpu in src/metal/primitives.cpp.
#include "core/feature_ops.h"

#include <stdexcept>
#include <string>

#include "core/dtypes.h"
#include "mlx/ops.h"

namespace mlx_lattice {

namespace {

void check_features(const mx::array& a, const char* op, const char* what) {
  if (a.ndim() != 2) {
    throw std::invalid_argument(
        std::string(op) + ": " + what + " must be an (N, C) array, got " + std::to_string(a.ndim()) +
        " dimensions");
  }
}

} // namespace

// ---------------------------------------------------------------- Fork

std::vector<mx::array> Fork::vjp(
    const std::vector<mx::array>&,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>&,
    const std::vector<mx::array>&) {
  return {cotangent_sum(cotangents[0], cotangents[1], stream())};
}

std::vector<mx::array> Fork::jvp(
    const std::vector<mx::array>&,
    const std::vector<mx::array>& tangents,
    const std::vector<int>&) {
  return {tangents[0], tangents[0]};
}

std::vector<mx::Shape> Fork::output_shapes(const std::vector<mx::array>& in) {
  return {in[0].shape(), in[0].shape()};
}

std::vector<mx::array> fork(const mx::array& x, mx::Stream s) {
  return mx::array::make_arrays(
      {x.shape(), x.shape()}, {x.dtype(), x.dtype()}, std::make_shared<Fork>(s), {x});
}

// ---------------------------------------------------------------- CotangentSum

std::vector<mx::array> CotangentSum::vjp(
    const std::vector<mx::array>&,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>& argnums,
    const std::vector<mx::array>&) {
  return std::vector<mx::array>(argnums.size(), cotangents[0]);
}

std::vector<mx::array> CotangentSum::jvp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& tangents,
    const std::vector<int>& argnums) {
  if (argnums.size() == 2) {
    return {cotangent_sum(tangents[0], tangents[1], stream())};
  }
  return {tangents[0]};
}

std::vector<mx::Shape> CotangentSum::output_shapes(const std::vector<mx::array>& in) {
  return {in[0].shape()};
}

mx::array cotangent_sum(const mx::array& a, const mx::array& b, mx::Stream s) {
  if (s.device != mx::Device::cpu) {
    return mx::add(a, b, s);
  }
  check_features(a, "cotangent_sum", "a");
  check_features(b, "cotangent_sum", "b");
  if (a.shape() != b.shape() || a.dtype() != b.dtype() || !is_feature_dtype(a.dtype())) {
    throw std::invalid_argument(
        "cotangent_sum: a and b must have one shape and one floating dtype (float32, float16, bfloat16)");
  }
  return mx::array(a.shape(), a.dtype(), std::make_shared<CotangentSum>(s), {a, b});
}

// ---------------------------------------------------------------- ConcatColumns

std::vector<mx::array> ConcatColumns::vjp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>& argnums,
    const std::vector<mx::array>&) {
  std::vector<int> start(primals.size() + 1, 0);
  for (size_t k = 0; k < primals.size(); ++k) {
    start[k + 1] = start[k] + primals[k].shape(1);
  }
  const int N = cotangents[0].shape(0);
  std::vector<mx::array> grads;
  for (int k : argnums) {
    grads.push_back(mx::slice(cotangents[0], {0, start[k]}, {N, start[k + 1]}, stream()));
  }
  return grads;
}

std::vector<mx::array> ConcatColumns::jvp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& tangents,
    const std::vector<int>& argnums) {
  std::vector<mx::array> parts;
  for (size_t k = 0; k < primals.size(); ++k) {
    parts.push_back(mx::zeros_like(primals[k], stream()));
  }
  for (size_t j = 0; j < argnums.size(); ++j) {
    parts[argnums[j]] = tangents[j];
  }
  return {concat_columns(parts, stream())};
}

std::vector<mx::Shape> ConcatColumns::output_shapes(const std::vector<mx::array>& in) {
  int C = 0;
  for (const auto& a : in) {
    C += a.shape(1);
  }
  return {{in[0].shape(0), C}};
}

mx::array concat_columns(const std::vector<mx::array>& xs, mx::Stream s) {
  if (xs.empty()) {
    throw std::invalid_argument("concat_columns: needs at least one array");
  }
  int C = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    check_features(xs[k], "concat_columns", "every array");
    if (xs[k].shape(0) != xs[0].shape(0) || xs[k].dtype() != xs[0].dtype()) {
      throw std::invalid_argument("concat_columns: arrays must have one row count and one dtype");
    }
    C += xs[k].shape(1);
  }
  if (!is_feature_dtype(xs[0].dtype())) {
    throw std::invalid_argument("concat_columns: arrays must be float32, float16 or bfloat16");
  }
  if (s.device != mx::Device::cpu) {
    return mx::concatenate(xs, 1, s);
  }
  return mx::array({xs[0].shape(0), C}, xs[0].dtype(), std::make_shared<ConcatColumns>(s), xs);
}

} // namespace mlx_lattice
