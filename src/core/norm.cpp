// Fused normalisation + activation: the primitives. Their CPU kernels are
// compiled per instruction-set path (src/cpu/norm_act.cpp); on a Metal GPU
// they run the programs of src/metal/norm_act.cpp.
#include "core/norm.h"

#include <array>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/threadpool.h"
#include "cpu/kernels.h"
#include "metal/norm_act.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"

namespace mlx_lattice {

namespace {

cpu::NormShape norm_shape(const NormSpec& sp, int64_t N, int64_t C) {
  return {N, C, sp.segments, sp.training, low_slope(sp.act, sp.slope), sp.eps};
}

mx::array dense(const mx::array& a, mx::Dtype dt, mx::Stream s) {
  return mx::contiguous(mx::astype(a, dt, s), false, s);
}

// Row stride of an evaluated (N, C) array whose rows are read in place by
// the backward kernel (unit column stride, rows at least C apart: a column
// slice of a wider array, such as a concatenation's gradient), or 0.
int64_t row_stride(const mx::array& a) {
  const int64_t N = a.shape(0), C = a.shape(1);
  if (C > 1 && a.strides()[1] != 1) {
    return 0;
  }
  if (N <= 1) {
    return C;
  }
  return a.strides()[0] >= C ? a.strides()[0] : 0;
}

// Elements of an (N, C) array of any strides (in elements) copied to dense
// rows at out.
void copy_rows(
    const char* src, int64_t N, int64_t C, int64_t s0, int64_t s1, size_t size, char* out) {
  parallel_for(N, 256, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t c = 0; c < C; ++c) {
        std::memcpy(out + (i * C + c) * size, src + (i * s0 + c * s1) * int64_t(size), size);
      }
    }
  });
}

} // namespace

// ---------------------------------------------------------------- NormAct

void NormAct::eval_cpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  auto& enc = cpu::encode_all(in, out, stream());
  const auto& x = in[0];
  const int64_t N = x.shape(0), C = x.shape(1);
  int next = 3;
  const mx::array* mean_in = nullptr;
  const mx::array* var_in = nullptr;
  if (!spec_.training) {
    mean_in = &in[3];
    var_in = &in[4];
    next = 5;
  }
  const mx::array* r = spec_.residual ? &in[next++] : nullptr;
  const mx::array* seg = spec_.segmented ? &in[next++] : nullptr;
  enc.dispatch([fn = cpu::active_kernels().norm_forward,
                t = cpu::feature_type(x.dtype()),
                shape = norm_shape(spec_, N, C),
                xp = x.data<void>(),
                wp = in[1].data<float>(),
                bp = in[2].data<float>(),
                rp = r ? r->data<void>() : nullptr,
                sp = seg ? seg->data<int32_t>() : nullptr,
                mi = mean_in ? mean_in->data<float>() : nullptr,
                vi = var_in ? var_in->data<float>() : nullptr,
                mo = spec_.training ? out[1].data<float>() : nullptr,
                vo = spec_.training ? out[2].data<float>() : nullptr,
                yp = out[0].data<void>()]() {
    fn(t, shape, xp, wp, bp, rp, sp, mi, vi, mo, vo, yp);
  });
}

// Metal only: on other GPUs the layers do not build this primitive
// (mlx_lattice/nn/normalization.py).
// Both passes' GPU programs exist only in builds with the Metal kernels.
static void require_metal_kernels() {
  if (!metal::available()) {
    throw std::runtime_error(
        "norm_act: this build has no Metal kernels; on other GPUs the norms "
        "run as MLX ops");
  }
}

void NormAct::eval_gpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  require_metal_kernels();
  const auto& x = in[0];
  metal::run(
      metal::norm_forward_program(spec_, x.shape(0), x.shape(1), x.dtype()), in, out, stream());
}

std::vector<mx::Shape> NormAct::output_shapes(
    const std::vector<mx::array>& in) {
  if (!spec_.training) {
    return {in[0].shape()};
  }
  mx::Shape stats = {spec_.segments, in[0].shape(1)};
  return {in[0].shape(), stats, stats};
}

bool NormAct::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const NormAct&>(other).spec_;
  return o.segments == spec_.segments && o.segmented == spec_.segmented &&
      o.training == spec_.training && o.residual == spec_.residual &&
      o.act == spec_.act && o.slope == spec_.slope && o.eps == spec_.eps;
}

std::vector<mx::array> NormAct::vjp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>& argnums,
    const std::vector<mx::array>& outputs) {
  auto s = stream();
  const auto& x = primals[0];
  const auto& w = primals[1];
  int next = spec_.training ? 3 : 5;
  int r_arg = spec_.residual ? next++ : -1;
  int seg_arg = spec_.segmented ? next++ : -1;
  // The CPU task reads a row-strided cotangent (a concatenation's column
  // slice) in place; the Metal programs bind it as dense rows.
  auto ct = s.device == mx::Device::cpu ? mx::astype(cotangents[0], x.dtype(), s)
                                        : dense(cotangents[0], x.dtype(), s);
  // x, w and b are NormAct's inputs, which norm_act made dense already.
  std::vector<mx::array> in = {x, outputs[0], ct, w, primals[2]};
  if (spec_.training) {
    in.push_back(outputs[1]);
    in.push_back(outputs[2]);
  } else {
    in.push_back(primals[3]);
    in.push_back(primals[4]);
  }
  if (seg_arg >= 0) {
    in.push_back(primals[seg_arg]);
  }
  if (spec_.training) {
    in.push_back(dense(cotangents[1], mx::float32, s));
    in.push_back(dense(cotangents[2], mx::float32, s));
  }
  auto grads = mx::array::make_arrays(
      spec_.residual
          ? std::vector<mx::Shape>{x.shape(), w.shape(), w.shape(), x.shape()}
          : std::vector<mx::Shape>{x.shape(), w.shape(), w.shape()},
      spec_.residual
          ? std::vector<mx::Dtype>{x.dtype(), mx::float32, mx::float32, x.dtype()}
          : std::vector<mx::Dtype>{x.dtype(), mx::float32, mx::float32},
      std::make_shared<NormActGrad>(s, spec_),
      in);
  std::vector<mx::array> out;
  for (int arg : argnums) {
    if (arg == 0) {
      out.push_back(grads[0]);
    } else if (arg == 1) {
      out.push_back(grads[1]);
    } else if (arg == 2) {
      out.push_back(grads[2]);
    } else if (arg == r_arg) {
      out.push_back(grads[3]);
    } else if (!spec_.training && (arg == 3 || arg == 4)) {
      // Given statistics (C,): d mean = -w inv sum g, d var = -w inv^2 sum g xhat / 2.
      auto inv = mx::rsqrt(mx::add(primals[4], mx::array(spec_.eps), s), s);
      auto wi = mx::multiply(w, inv, s);
      out.push_back(
          arg == 3 ? mx::negative(mx::multiply(wi, grads[2], s), s)
                   : mx::multiply(
                         mx::multiply(wi, inv, s),
                         mx::multiply(grads[1], mx::array(-0.5f), s),
                         s));
    } else {
      out.push_back(mx::zeros_like(primals[arg], s));
    }
  }
  return out;
}

std::vector<mx::array> NormAct::jvp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& tangents,
    const std::vector<int>& argnums) {
  auto s = stream();
  const auto& x = primals[0];
  const auto& w = primals[1];
  const int C = x.shape(1);
  int next = spec_.training ? 3 : 5;
  int r_arg = spec_.residual ? next++ : -1;
  int seg_arg = spec_.segmented ? next++ : -1;
  auto outs = mx::array::make_arrays(
      output_shapes(primals),
      spec_.training
          ? std::vector<mx::Dtype>{x.dtype(), mx::float32, mx::float32}
          : std::vector<mx::Dtype>{x.dtype()},
      std::make_shared<NormAct>(s, spec_),
      primals);
  auto f32 = [&](const mx::array& a) { return mx::astype(a, mx::float32, s); };
  mx::array mean = spec_.training ? outs[1] : primals[3];
  mx::array var = spec_.training ? outs[2] : primals[4];
  auto inv = mx::rsqrt(mx::add(var, mx::array(spec_.eps), s), s);
  // Per-row statistics, and per-segment means of (N, C) arrays.
  std::optional<mx::array> seg, count;
  if (seg_arg >= 0) {
    seg = primals[seg_arg];
    count = mx::scatter_add(
        mx::zeros({spec_.segments, 1}, mx::float32, s), *seg,
        mx::ones({x.shape(0), 1, 1}, mx::float32, s), 0, s);
  }
  auto rows = [&](const mx::array& a) {
    return seg ? mx::take(a, *seg, 0, s) : a;
  };
  auto seg_mean = [&](const mx::array& v) {
    if (!seg) {
      return mx::mean(v, 0, true, s);
    }
    auto sum = mx::scatter_add(
        mx::zeros({spec_.segments, C}, mx::float32, s), *seg,
        mx::expand_dims(v, 1, s), 0, s);
    return mx::divide(sum, mx::maximum(*count, mx::array(1.0f), s), s);
  };
  auto inv_r = rows(inv);
  auto xhat = mx::multiply(mx::subtract(f32(x), rows(mean), s), inv_r, s);
  auto zero_rows = mx::zeros(x.shape(), mx::float32, s);
  mx::array dz = zero_rows;
  mx::array dxhat = zero_rows;
  mx::array dmean = mx::zeros({spec_.segments, C}, mx::float32, s);
  mx::array dvar = dmean;
  for (size_t i = 0; i < argnums.size(); ++i) {
    int arg = argnums[i];
    auto t = f32(tangents[i]);
    if (arg == 0) {
      if (spec_.training) {
        auto m1 = seg_mean(t);
        auto m2 = seg_mean(mx::multiply(t, xhat, s));
        dxhat = mx::add(dxhat, mx::multiply(inv_r, mx::subtract(
            mx::subtract(t, rows(m1), s), mx::multiply(xhat, rows(m2), s), s), s), s);
        dmean = m1;
        dvar = mx::divide(mx::multiply(m2, mx::array(2.0f), s), inv, s);
      } else {
        dxhat = mx::add(dxhat, mx::multiply(t, inv_r, s), s);
      }
    } else if (arg == 1) {
      dz = mx::add(dz, mx::multiply(t, xhat, s), s);
    } else if (arg == 2 || arg == r_arg) {
      dz = mx::add(dz, t, s);
    } else if (!spec_.training && arg == 3) {
      dxhat = mx::subtract(dxhat, mx::multiply(t, inv, s), s);
    } else if (!spec_.training && arg == 4) {
      auto k = mx::multiply(mx::multiply(inv, inv, s), mx::array(-0.5f), s);
      dxhat = mx::add(dxhat, mx::multiply(xhat, mx::multiply(t, k, s), s), s);
    }
  }
  dz = mx::add(dz, mx::multiply(w, dxhat, s), s);
  float lo = low_slope(spec_.act, spec_.slope);
  auto slope = mx::where(
      mx::greater(outs[0], mx::array(0.0f, x.dtype()), s), mx::array(1.0f),
      mx::array(lo), s);
  auto dy = mx::astype(mx::multiply(dz, slope, s), x.dtype(), s);
  if (!spec_.training) {
    return {dy};
  }
  return {dy, dmean, dvar};
}

// ---------------------------------------------------------------- NormActGrad

void NormActGrad::eval_cpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  auto& enc = cpu::encode_all(in, out, stream());
  const auto& x = in[0];
  const int64_t N = x.shape(0), C = x.shape(1);
  int next = 7;
  const mx::array* seg = spec_.segmented ? &in[next++] : nullptr;
  const mx::array* cm = spec_.training ? &in[next++] : nullptr;
  const mx::array* cv = spec_.training ? &in[next++] : nullptr;
  // The cotangent comes in whatever layout its producer left (the vjp does
  // not copy it): row-strided rows are read in place, anything else (a
  // transpose, a broadcast) is copied to rows by the task first.
  const auto& ct = in[2];
  auto shape = norm_shape(spec_, N, C);
  shape.ct_ld = row_stride(ct);
  const bool gather_ct = shape.ct_ld == 0;
  if (gather_ct) {
    shape.ct_ld = C;
  }
  enc.dispatch([fn = cpu::active_kernels().norm_backward,
                t = cpu::feature_type(x.dtype()),
                shape,
                gather_ct,
                ct_strides = std::array<int64_t, 2>{ct.strides()[0], ct.strides()[1]},
                ct_size = ct.itemsize(),
                xp = x.data<void>(),
                yp = in[1].data<void>(),
                cp = ct.data<void>(),
                wp = in[3].data<float>(),
                bp = in[4].data<float>(),
                mp = in[5].data<float>(),
                vp = in[6].data<float>(),
                sp = seg ? seg->data<int32_t>() : nullptr,
                cmp = cm ? cm->data<float>() : nullptr,
                cvp = cv ? cv->data<float>() : nullptr,
                dx = out[0].data<void>(),
                dw = out[1].data<float>(),
                db = out[2].data<float>(),
                gp = spec_.residual ? out[3].data<void>() : nullptr]() {
    std::vector<char> dense_ct;
    const void* ctp = cp;
    if (gather_ct) {
      dense_ct.resize(shape.N * shape.C * ct_size);
      copy_rows(static_cast<const char*>(cp), shape.N, shape.C, ct_strides[0], ct_strides[1],
                ct_size, dense_ct.data());
      ctp = dense_ct.data();
    }
    fn(t, shape, xp, yp, ctp, wp, bp, mp, vp, sp, cmp, cvp, dx, dw, db, gp);
  });
}

void NormActGrad::eval_gpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  require_metal_kernels();
  const auto& x = in[0];
  metal::run(
      metal::norm_backward_program(spec_, x.shape(0), x.shape(1), x.dtype()), in, out, stream());
}

std::vector<mx::Shape> NormActGrad::output_shapes(
    const std::vector<mx::array>& in) {
  mx::Shape c = {in[0].shape(1)};
  if (spec_.residual) {
    return {in[0].shape(), c, c, in[0].shape()};
  }
  return {in[0].shape(), c, c};
}

bool NormActGrad::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const NormActGrad&>(other).spec_;
  return o.segments == spec_.segments && o.segmented == spec_.segmented &&
      o.training == spec_.training && o.residual == spec_.residual &&
      o.act == spec_.act && o.slope == spec_.slope && o.eps == spec_.eps;
}

// ---------------------------------------------------------------- RunningStats

void RunningStats::eval_cpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  auto& enc = cpu::encode_all(in, out, stream());
  // Element c of a C-element array of any shape: its last axis' stride
  // (the leading axes have extent 1).
  auto vec = [](const mx::array& a) {
    return std::pair<const float*, int64_t>{
        a.data<float>(), a.ndim() ? int64_t(a.strides().back()) : 0};
  };
  enc.dispatch([m = vec(in[0]), v = vec(in[1]), bm = vec(in[2]), bv = vec(in[3]),
                C = int64_t(out[0].size()), keep = keep_, mu = mu_, ratio = ratio_,
                nm = out[0].data<float>(), nv = out[1].data<float>()]() {
    for (int64_t c = 0; c < C; ++c) {
      const float a = keep * m.first[c * m.second];
      const float b = mu * bm.first[c * bm.second];
      nm[c] = a + b;
      const float u = bv.first[c * bv.second] * ratio;
      const float w = mu * u;
      nv[c] = keep * v.first[c * v.second] + w;
    }
  });
}

void RunningStats::eval_gpu(
    const std::vector<mx::array>&,
    std::vector<mx::array>&) {
  throw std::runtime_error("running_stats: a CPU primitive (GPU streams use MLX's ops)");
}

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
    mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s);
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
  if (!spec.segmented && n_segments != 1) {
    throw std::invalid_argument("norm_act: n_segments > 1 needs segment ids");
  }
  if (!spec.training && spec.segmented) {
    throw std::invalid_argument("norm_act: given statistics are per channel; no segments in eval mode");
  }
  std::vector<mx::array> in = {
      dense(x, x.dtype(), stream),
      dense(weight, mx::float32, stream),
      dense(bias, mx::float32, stream)};
  if (!spec.training) {
    check_vec(*mean, "mean");
    check_vec(*var, "var");
    in.push_back(mx::reshape(dense(*mean, mx::float32, stream), {1, C}, stream));
    in.push_back(mx::reshape(dense(*var, mx::float32, stream), {1, C}, stream));
  }
  if (spec.residual) {
    if (residual->shape() != x.shape() || residual->dtype() != x.dtype()) {
      throw std::invalid_argument("norm_act: residual must match x in shape and dtype");
    }
    in.push_back(dense(*residual, x.dtype(), stream));
  }
  if (spec.segmented) {
    if (segments->ndim() != 1 || segments->shape(0) != x.shape(0)) {
      throw std::invalid_argument("norm_act: segments must have shape (N,)");
    }
    in.push_back(dense(*segments, mx::int32, stream));
  }
  auto prim = std::make_shared<NormAct>(stream, spec);
  if (!spec.training) {
    auto y = mx::array(x.shape(), x.dtype(), prim, in);
    return {y};
  }
  mx::Shape stats = {n_segments, C};
  return mx::array::make_arrays(
      {x.shape(), stats, stats},
      {x.dtype(), mx::float32, mx::float32},
      prim,
      in);
}

} // namespace mlx_lattice
