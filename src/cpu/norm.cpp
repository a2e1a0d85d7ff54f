// NormAct, NormActGrad and RunningStats on the CPU (core/norm.h): each
// eval_cpu encodes one task; the norms' call their kernel, compiled per
// instruction-set path (src/cpu/norm_act.cpp).
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#include "core/norm.h"
#include "core/threadpool.h"
#include "cpu/kernels.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlx_lattice {

namespace {

cpu::NormShape norm_shape(const NormSpec& sp, int64_t N, int64_t C) {
  return {N, C, sp.segments, sp.training, low_slope(sp.act, sp.slope), sp.eps};
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

void running_update(
    const float* mean, int64_t sm, const float* var, int64_t sv,
    const float* batch_mean, int64_t sbm, const float* batch_var, int64_t sbv,
    int64_t C, float keep, float mu, float ratio, float* new_mean, float* new_var) {
  for (int64_t c = 0; c < C; ++c) {
    const float a = keep * mean[c * sm];
    const float b = mu * batch_mean[c * sbm];
    new_mean[c] = a + b;
    const float u = batch_var[c * sbv] * ratio;
    const float w = mu * u;
    new_var[c] = keep * var[c * sv] + w;
  }
}

namespace {

// Element c of a C-element float32 array of any shape: its data and the
// stride of its last axis (the leading axes have extent 1).
std::pair<const float*, int64_t> channels(const mx::array& a) {
  return {a.data<float>(), a.ndim() ? int64_t(a.strides().back()) : 0};
}

} // namespace

// ---------------------------------------------------------------- NormAct

// Inputs come as the graph left them: a task copies any that is not dense
// (cpu::dense) ahead of the kernel's.
void NormAct::eval_cpu(
    const std::vector<mx::array>& in_graph,
    std::vector<mx::array>& out) {
  auto& enc = cpu::encode_all(in_graph, out, stream());
  std::vector<mx::array> in;
  for (const auto& a : in_graph) {
    in.push_back(cpu::dense(a, stream()));
  }
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
  const bool running = spec_.training && spec_.running;
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
                yp = out[0].data<void>(),
                rm = running ? channels(in_graph[next]) : std::pair<const float*, int64_t>{},
                rv = running ? channels(in_graph[next + 1]) : std::pair<const float*, int64_t>{},
                nm = running ? out[3].data<float>() : nullptr,
                nv = running ? out[4].data<float>() : nullptr,
                sp_ = spec_]() {
    fn(t, shape, xp, wp, bp, rp, sp, mi, vi, mo, vo, yp);
    if (nm) {
      // the batch's (1, C) statistics into the running ones, as RunningStats
      running_update(rm.first, rm.second, rv.first, rv.second, mo, 1, vo, 1, shape.C,
                     sp_.keep, sp_.mu, sp_.ratio, nm, nv);
    }
  });
}

// ---------------------------------------------------------------- NormActGrad

void NormActGrad::eval_cpu(
    const std::vector<mx::array>& in_graph,
    std::vector<mx::array>& out) {
  auto& enc = cpu::encode_all(in_graph, out, stream());
  // The cotangent (in[2]) comes in whatever layout its producer left:
  // row-strided rows are read in place, anything else (a transpose, a
  // broadcast) is copied to rows by the task. The rest is made dense first.
  std::vector<mx::array> in;
  for (size_t i = 0; i < in_graph.size(); ++i) {
    in.push_back(i == 2 ? in_graph[i] : cpu::dense(in_graph[i], stream()));
  }
  const auto& x = in[0];
  const int64_t N = x.shape(0), C = x.shape(1);
  int next = 7;
  const mx::array* seg = spec_.segmented ? &in[next++] : nullptr;
  const bool stat_cts = spec_.training && spec_.stats_grad;
  const mx::array* cm = stat_cts ? &in[next++] : nullptr;
  const mx::array* cv = stat_cts ? &in[next++] : nullptr;
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

// ---------------------------------------------------------------- RunningStats

void RunningStats::eval_cpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  auto& enc = cpu::encode_all(in, out, stream());
  enc.dispatch([m = channels(in[0]), v = channels(in[1]), bm = channels(in[2]), bv = channels(in[3]),
                C = int64_t(out[0].size()), keep = keep_, mu = mu_, ratio = ratio_,
                nm = out[0].data<float>(), nv = out[1].data<float>()]() {
    running_update(m.first, m.second, v.first, v.second, bm.first, bm.second, bv.first, bv.second,
                   C, keep, mu, ratio, nm, nv);
  });
}

} // namespace mlx_lattice
