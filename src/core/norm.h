// Fused normalisation + activation on voxel features: the primitives, run
// by CPU kernels (src/cpu/norm_act.cpp) and Metal programs
// (src/metal/norm_act.cpp).
//
// NormAct computes, per channel c and row i of segment s(i),
//     y = act(weight * (x - mean_s) / sqrt(var_s + eps) + bias [+ residual])
// Training mode takes mean_s / var_s (biased) from the rows of each segment
// (one segment: batch norm; one per batch item: instance norm) and returns
// them as extra outputs; eval mode reads them from inputs (running stats).
// Statistics and affine parameters are float32; x, residual and y share one
// floating dtype (float16 / bfloat16 accumulate in float32). Rows are reduced
// in fixed chunks, combined in chunk order, so results do not depend on the
// thread count.
#pragma once

#include <optional>

#include "core/primitive_decl.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

namespace mlx_lattice {

namespace mx = mlx::core;

enum class Activation : int { Identity = 0, ReLU = 1, LeakyReLU = 2 };

struct NormSpec {
  int segments = 1;        // S; > 1 (or segment ids given) groups rows
  bool segmented = false;  // a segment-id input follows
  bool training = true;    // statistics from the batch (else given)
  bool residual = false;   // a residual input is added before act
  Activation act = Activation::Identity;
  float slope = 0.0f;      // LeakyReLU's negative slope (>= 0)
  float eps = 1e-5f;
  // Training, CPU: whether gradients flow through the statistics outputs
  // (false where a layer reads them only for its running statistics: the
  // backward pass then takes no cotangents for them).
  bool stats_grad = true;
  // Training, CPU: a batch norm's float32 running statistics are inputs
  // and their update (RunningStats' arithmetic) two more outputs.
  bool running = false;
  float keep = 0.0f, mu = 0.0f, ratio = 0.0f;
};

// Activations as y = z > 0 ? z : lo * z, and act'(z) = z > 0 ? 1 : lo, with
// lo = 1 (identity), 0 (ReLU) or the slope (LeakyReLU).
inline float low_slope(Activation a, float slope) {
  return a == Activation::Identity ? 1.0f : a == Activation::ReLU ? 0.0f : slope;
}

// Inputs: x, weight, bias, [residual], [segment ids in [0, S): the layers
// pass batch columns, validated when the tensor was built], [running mean,
// running var] (training) or
//         x, weight, bias, mean, var, [residual] (eval).
// Outputs: y, and in training mode mean (S, C) and biased var (S, C), then
// with running statistics their new values (C,) (no gradient: state).
// On the CPU every input is read as it comes (a task copies what is not
// dense); on Metal the op makes them dense in the graph.
class NormAct : public mx::Primitive {
 public:
  NormAct(mx::Stream s, NormSpec spec) : mx::Primitive(s), spec_(spec) {}

  LATTICE_EVAL()
  // Both transforms are mlx_lattice/autodiff.py's rules (src/core/autodiff.h):
  // the vjp runs NormActGrad (norm_act_backward), forward mode MLX ops.
  LATTICE_VJP()
  LATTICE_JVP()
  LATTICE_OUTPUT_SHAPES()
  LATTICE_NAME("SparseNormAct")
  bool is_equivalent(const mx::Primitive& other) const override;

  const NormSpec& spec() const {
    return spec_;
  }

 private:
  NormSpec spec_;
};

// The backward pass of NormAct. Inputs: x, y, ct_y, weight, bias, mean, var,
// [segment ids], and in training mode with stats_grad ct_mean, ct_var
// (without: zero). Outputs: dx,
// dweight = sum g * xhat, dbias = sum g (float32, (C,)), where
// g = ct_y * act'(y) is also the residual's gradient.
class NormActGrad : public mx::Primitive {
 public:
  NormActGrad(mx::Stream s, NormSpec spec) : mx::Primitive(s), spec_(spec) {}

  LATTICE_EVAL()
  LATTICE_OUTPUT_SHAPES()
  LATTICE_NAME("SparseNormActGrad")
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  NormSpec spec_;
};

// NormActGrad on a NormAct's primals, cotangents (one per output) and
// outputs: {dx, dweight, dbias[, dresidual]}, what the reverse-mode rule
// assigns to the inputs.
std::vector<mx::array> norm_act_backward(
    NormAct& norm,
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& cotangents,
    const std::vector<mx::array>& outputs);

// A batch norm's running statistics after a training step, in one CPU
// task: new_mean = keep * mean + mu * batch_mean and new_var = keep * var +
// mu * (batch_var * ratio), each product and the sum rounded to float32 as
// MLX's Multiply and Add round them (keep = 1 - momentum, mu = momentum,
// ratio = n / (n - 1), each already rounded to float32), so the bits are
// those of the same expression in MLX ops, without its dozen small
// single-threaded ops per norm. Inputs: mean, var, batch_mean, batch_var
// (float32, C elements each, any strides). Outputs: new_mean, new_var (C,).
// Gradients do not flow through (running statistics are state).
class RunningStats : public mx::Primitive {
 public:
  RunningStats(mx::Stream s, float keep, float mu, float ratio)
      : mx::Primitive(s), keep_(keep), mu_(mu), ratio_(ratio) {}

  LATTICE_EVAL()
  LATTICE_VJP()
  LATTICE_JVP()
  LATTICE_OUTPUT_SHAPES()
  LATTICE_NAME("SparseRunningStats")
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  float keep_, mu_, ratio_;
};

// Builds RunningStats' graph (CPU streams; elsewhere the same MLX ops).
std::vector<mx::array> running_stats(
    const mx::array& mean,
    const mx::array& var,
    const mx::array& batch_mean,
    const mx::array& batch_var,
    float keep,
    float mu,
    float ratio,
    mx::StreamOrDevice s = {});

// RunningStats' arithmetic for C channels (strides in elements), shared
// with NormAct's running update so that both round alike.
void running_update(
    const float* mean, int64_t sm, const float* var, int64_t sv,
    const float* batch_mean, int64_t sbm, const float* batch_var, int64_t sbv,
    int64_t C, float keep, float mu, float ratio, float* new_mean, float* new_var);

// A batch norm layer's training call with float32 (C,) running statistics:
// {y, new running mean, new running var}, NormAct with the running update
// folded in (one primitive, RunningStats' bits) on the CPU; elsewhere
// norm_act then running_stats. The statistics take no gradient.
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
    mx::StreamOrDevice s = {});

// Builds NormAct's graph; returns {y} (eval) or {y, mean, var} (training).
// stats_grad = false: the statistics take no gradient (CPU streams; on
// others they do either way).
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
    mx::StreamOrDevice s = {},
    bool stats_grad = true);

} // namespace mlx_lattice
