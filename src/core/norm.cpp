// Fused normalisation + activation: the primitives apart from their
// evaluation (the op's checks, the backward primitive's inputs; the autodiff
// rules are mlx_lattice/autodiff.py's). eval_cpu is in
// src/cpu/norm.cpp, over the kernels of src/cpu/norm_act.cpp; eval_gpu in
// src/metal/norm_act.cpp, beside the programs it encodes.
#include "core/norm.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/autodiff.h"
#include "mlx/ops.h"

namespace mlx_lattice {

namespace {

mx::array dense(const mx::array& a, mx::Dtype dt, mx::Stream s) {
  return mx::contiguous(mx::astype(a, dt, s), false, s);
}

// An input of the norms' primitives: on the CPU as it comes (the tasks
// copy what they cannot read in place: src/cpu/norm.cpp), dense for the
// Metal programs.
mx::array operand(const mx::array& a, mx::Dtype dt, mx::Stream s) {
  return s.device == mx::Device::cpu ? mx::astype(a, dt, s) : dense(a, dt, s);
}

// ---------------------------------------------------------------- NormAct

bool same_spec(const NormSpec& a, const NormSpec& b) {
  return a.segments == b.segments && a.segmented == b.segmented && a.training == b.training &&
      a.residual == b.residual && a.act == b.act && a.slope == b.slope && a.eps == b.eps &&
      a.stats_grad == b.stats_grad && a.running == b.running && a.keep == b.keep &&
      a.mu == b.mu && a.ratio == b.ratio;
}

// NormAct's outputs: y, then (training) the statistics and (running) the
// new running statistics.
std::vector<mx::Shape> norm_shapes(const NormSpec& spec, const mx::Shape& x) {
  if (!spec.training) {
    return {x};
  }
  mx::Shape stats = {spec.segments, x[1]};
  if (spec.running) {
    return {x, stats, stats, {x[1]}, {x[1]}};
  }
  return {x, stats, stats};
}

std::vector<mx::Dtype> norm_dtypes(const NormSpec& spec, mx::Dtype x) {
  std::vector<mx::Dtype> out(norm_shapes(spec, {0, 0}).size(), mx::float32);
  out[0] = x;
  return out;
}

} // namespace

std::vector<mx::Shape> NormAct::output_shapes(
    const std::vector<mx::array>& in) {
  return norm_shapes(spec_, in[0].shape());
}

bool NormAct::is_equivalent(const mx::Primitive& other) const {
  return same_spec(static_cast<const NormAct&>(other).spec_, spec_);
}

std::vector<mx::array> norm_act_backward(
    NormAct& norm,
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& cotangents,
    const std::vector<mx::array>& outputs) {
  const NormSpec& spec = norm.spec();
  auto s = norm.stream();
  const auto& x = primals[0];
  const auto& w = primals[1];
  int next = spec.training ? 3 : 5;
  if (spec.residual) {
    ++next;
  }
  int seg_arg = spec.segmented ? next : -1;
  // The CPU task reads a row-strided cotangent (a concatenation's column
  // slice) in place; the Metal programs bind it as dense rows.
  auto ct = operand(cotangents[0], x.dtype(), s);
  // x, w and b are NormAct's inputs, as norm_act passed them.
  std::vector<mx::array> in = {x, outputs[0], ct, w, primals[2]};
  if (spec.training) {
    in.push_back(outputs[1]);
    in.push_back(outputs[2]);
  } else {
    in.push_back(primals[3]);
    in.push_back(primals[4]);
  }
  if (seg_arg >= 0) {
    in.push_back(primals[seg_arg]);
  }
  if (spec.training && spec.stats_grad) {
    in.push_back(operand(cotangents[1], mx::float32, s));
    in.push_back(operand(cotangents[2], mx::float32, s));
  }
  return mx::array::make_arrays(
      spec.residual
          ? std::vector<mx::Shape>{x.shape(), w.shape(), w.shape(), x.shape()}
          : std::vector<mx::Shape>{x.shape(), w.shape(), w.shape()},
      spec.residual
          ? std::vector<mx::Dtype>{x.dtype(), mx::float32, mx::float32, x.dtype()}
          : std::vector<mx::Dtype>{x.dtype(), mx::float32, mx::float32},
      std::make_shared<NormActGrad>(s, spec),
      in);
}

std::vector<mx::array> NormAct::vjp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>& argnums,
    const std::vector<mx::array>& outputs) {
  return autodiff_rule({true, *this, primals, cotangents, argnums, outputs});
}

// The rule reads the outputs, remade here as one node (the primal's own).
std::vector<mx::array> NormAct::jvp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& tangents,
    const std::vector<int>& argnums) {
  auto outs = mx::array::make_arrays(
      output_shapes(primals), norm_dtypes(spec_, primals[0].dtype()),
      std::make_shared<NormAct>(stream(), spec_), primals);
  return autodiff_rule({false, *this, primals, tangents, argnums, std::move(outs)});
}

// ---------------------------------------------------------------- NormActGrad

std::vector<mx::Shape> NormActGrad::output_shapes(
    const std::vector<mx::array>& in) {
  mx::Shape c = {in[0].shape(1)};
  if (spec_.residual) {
    return {in[0].shape(), c, c, in[0].shape()};
  }
  return {in[0].shape(), c, c};
}

bool NormActGrad::is_equivalent(const mx::Primitive& other) const {
  return same_spec(static_cast<const NormActGrad&>(other).spec_, spec_);
}

// ---------------------------------------------------------------- RunningStats

std::vector<mx::array> RunningStats::vjp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>&,
    const std::vector<int>& argnums,
    const std::vector<mx::array>&) {
  std::vector<mx::array> out;
  for (int arg : argnums) {
    out.push_back(mx::zeros_like(primals[arg], stream()));
  }
  return out;
}

std::vector<mx::array> RunningStats::jvp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>&,
    const std::vector<int>&) {
  return {mx::zeros_like(primals[0], stream()), mx::zeros_like(primals[1], stream())};
}

std::vector<mx::Shape> RunningStats::output_shapes(const std::vector<mx::array>& in) {
  const int C = static_cast<int>(in[0].size());
  return {{C}, {C}};
}

bool RunningStats::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const RunningStats&>(other);
  return o.keep_ == keep_ && o.mu_ == mu_ && o.ratio_ == ratio_;
}

std::vector<mx::array> running_stats(
    const mx::array& mean,
    const mx::array& var,
    const mx::array& batch_mean,
    const mx::array& batch_var,
    float keep,
    float mu,
    float ratio,
    mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s);
  const auto C = mean.size();
  const mx::array* args[] = {&mean, &var, &batch_mean, &batch_var};
  const char* names[] = {"mean", "var", "batch_mean", "batch_var"};
  for (int k = 0; k < 4; ++k) {
    const auto& a = *args[k];
    if (a.dtype() != mx::float32) {
      throw std::invalid_argument(std::string("running_stats: ") + names[k] + " must be float32");
    }
    if (a.size() != C || (a.ndim() > 0 && a.shape().back() != static_cast<int>(C))) {
      throw std::invalid_argument(
          std::string("running_stats: ") + names[k] +
          " must hold C elements along its last axis, C = mean.size");
    }
  }
  if (stream.device != mx::Device::cpu) {
    // MLX's ops, in the order of the CPU task.
    auto f = [&](float v) { return mx::array(v, mx::float32); };
    auto flat = [&](const mx::array& a) { return mx::reshape(a, {static_cast<int>(C)}, stream); };
    auto nm = mx::add(mx::multiply(f(keep), flat(mean), stream),
                      mx::multiply(f(mu), flat(batch_mean), stream), stream);
    auto nv = mx::add(mx::multiply(f(keep), flat(var), stream),
                      mx::multiply(f(mu), mx::multiply(flat(batch_var), f(ratio), stream), stream),
                      stream);
    return {mx::stop_gradient(nm, stream), mx::stop_gradient(nv, stream)};
  }
  const int Ci = static_cast<int>(C);
  return mx::array::make_arrays(
      {{Ci}, {Ci}}, {mx::float32, mx::float32},
      std::make_shared<RunningStats>(stream, keep, mu, ratio),
      {mean, var, batch_mean, batch_var});
}

// ---------------------------------------------------------------- op

namespace {

std::vector<mx::array> make_norm(
    const mx::array& x, const NormSpec& spec, std::vector<mx::array> in, mx::Stream s) {
  auto prim = std::make_shared<NormAct>(s, spec);
  if (!spec.training) {
    return {mx::array(x.shape(), x.dtype(), prim, std::move(in))};
  }
  return mx::array::make_arrays(
      norm_shapes(spec, x.shape()), norm_dtypes(spec, x.dtype()), prim, std::move(in));
}

// Running statistics: float32, C elements along the last axis.
void check_running(const mx::array& mean, const mx::array& var, int64_t C, const char* op) {
  const mx::array* args[] = {&mean, &var};
  const char* names[] = {"running_mean", "running_var"};
  for (int k = 0; k < 2; ++k) {
    const auto& a = *args[k];
    if (a.dtype() != mx::float32) {
      throw std::invalid_argument(std::string(op) + ": " + names[k] + " must be float32");
    }
    if (static_cast<int64_t>(a.size()) != C || (a.ndim() > 0 && a.shape().back() != C)) {
      throw std::invalid_argument(
          std::string(op) + ": " + names[k] + " must hold C elements along its last axis, C = x.shape[1]");
    }
  }
}

// A NormAct's spec and inputs, after norm_act's checks.
struct NormCall {
  NormSpec spec;
  std::vector<mx::array> in;
};

NormCall norm_call(
    const mx::array& x,
    const mx::array& weight,
    const mx::array& bias,
    const std::optional<mx::array>& residual,
    const std::optional<mx::array>& segments,
    int n_segments,
    const std::optional<mx::array>& mean,
    const std::optional<mx::array>& var,
    float eps,
    int act,
    float slope,
    mx::Stream stream,
    bool stats_grad) {
  if (x.ndim() != 2) {
    throw std::invalid_argument("norm_act: x must have shape (N, C)");
  }
  const int C = x.shape(1);
  if (C > 0 && x.size() / C > INT32_MAX) {
    throw std::invalid_argument("norm_act: x has too many rows");
  }
  auto check_vec = [&](const mx::array& a, const char* what) {
    if (a.ndim() != 1 || a.shape(0) != C) {
      throw std::invalid_argument(
          std::string("norm_act: ") + what + " must have shape (C,) with C = x.shape[1]");
    }
  };
  check_vec(weight, "weight");
  check_vec(bias, "bias");
  if (act < 0 || act > 2) {
    throw std::invalid_argument("norm_act: act must be 0 (identity), 1 (relu) or 2 (leaky relu)");
  }
  if (act == 2 && !(slope >= 0.0f)) {
    throw std::invalid_argument("norm_act: the leaky relu slope must be >= 0");
  }
  if (!(eps > 0.0f)) {
    throw std::invalid_argument("norm_act: eps must be positive");
  }
  if (n_segments < 1) {
    throw std::invalid_argument("norm_act: n_segments must be >= 1");
  }
  if (mean.has_value() != var.has_value()) {
    throw std::invalid_argument("norm_act: give both mean and var (eval mode) or neither");
  }
  NormSpec spec;
  spec.segments = n_segments;
  spec.segmented = segments.has_value();
  spec.training = !mean.has_value();
  spec.residual = residual.has_value();
  spec.act = static_cast<Activation>(act);
  spec.slope = slope;
  spec.eps = eps;
  const bool cpu = stream.device == mx::Device::cpu;
  spec.stats_grad = stats_grad || !cpu;
  if (!spec.segmented && n_segments != 1) {
    throw std::invalid_argument("norm_act: n_segments > 1 needs segment ids");
  }
  if (!spec.training && spec.segmented) {
    throw std::invalid_argument("norm_act: given statistics are per channel; no segments in eval mode");
  }
  std::vector<mx::array> in = {
      operand(x, x.dtype(), stream),
      operand(weight, mx::float32, stream),
      operand(bias, mx::float32, stream)};
  if (!spec.training) {
    check_vec(*mean, "mean");
    check_vec(*var, "var");
    // (C,) on the CPU, read as it comes; (1, C) rows for the Metal programs
    for (const auto* a : {&*mean, &*var}) {
      in.push_back(cpu ? mx::astype(*a, mx::float32, stream)
                       : mx::reshape(dense(*a, mx::float32, stream), {1, C}, stream));
    }
  }
  if (spec.residual) {
    if (residual->shape() != x.shape() || residual->dtype() != x.dtype()) {
      throw std::invalid_argument("norm_act: residual must match x in shape and dtype");
    }
    in.push_back(operand(*residual, x.dtype(), stream));
  }
  if (spec.segmented) {
    if (segments->ndim() != 1 || segments->shape(0) != x.shape(0)) {
      throw std::invalid_argument("norm_act: segments must have shape (N,)");
    }
    in.push_back(operand(*segments, mx::int32, stream));
  }
  return {spec, std::move(in)};
}

} // namespace

std::vector<mx::array> norm_act(
    const mx::array& x,
    const mx::array& weight,
    const mx::array& bias,
    const std::optional<mx::array>& residual,
    const std::optional<mx::array>& segments,
    int n_segments,
    const std::optional<mx::array>& mean,
    const std::optional<mx::array>& var,
    float eps,
    int act,
    float slope,
    mx::StreamOrDevice s,
    bool stats_grad) {
  auto stream = mx::to_stream(s);
  auto c = norm_call(x, weight, bias, residual, segments, n_segments, mean, var, eps, act, slope,
                     stream, stats_grad);
  return make_norm(x, c.spec, std::move(c.in), stream);
}

std::vector<mx::array> norm_act_running(
    const mx::array& x,
    const mx::array& weight,
    const mx::array& bias,
    const std::optional<mx::array>& residual,
    float eps,
    int act,
    float slope,
    const mx::array& running_mean,
    const mx::array& running_var,
    float keep,
    float mu,
    float ratio,
    mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s);
  if (stream.device != mx::Device::cpu) {
    auto r = norm_act(x, weight, bias, residual, std::nullopt, 1, std::nullopt, std::nullopt,
                      eps, act, slope, stream);
    auto st = running_stats(running_mean, running_var, r[1], r[2], keep, mu, ratio, stream);
    return {r[0], st[0], st[1]};
  }
  // norm_act's checks and inputs, the running statistics appended (checked
  // as running_stats checks them); the statistics take no gradient.
  auto c = norm_call(x, weight, bias, residual, std::nullopt, 1, std::nullopt, std::nullopt,
                     eps, act, slope, stream, false);
  check_running(running_mean, running_var, x.shape(1), "norm_act_running");
  c.spec.running = true;
  c.spec.keep = keep;
  c.spec.mu = mu;
  c.spec.ratio = ratio;
  c.in.push_back(running_mean);
  c.in.push_back(running_var);
  auto out = make_norm(x, c.spec, std::move(c.in), stream);
  return {out[0], out[3], out[4]};
}

} // namespace mlx_lattice
