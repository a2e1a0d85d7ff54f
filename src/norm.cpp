// Fused normalisation + activation: the CPU kernels and their primitives.
#include "norm.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "cpu/convert.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "threadpool.h"

namespace mlx_lattice {

namespace {

// Rows per reduction chunk: fixed, so the summation order (float32 within a
// chunk, float64 across chunks in chunk order) never depends on threads.
constexpr int64_t kRows = 256;

int64_t n_chunks(int64_t n) {
  return (n + kRows - 1) / kRows;
}

// Activations as y = z > 0 ? z : lo * z, and act'(z) = z > 0 ? 1 : lo, with
// lo = 1 (identity), 0 (ReLU) or the slope (LeakyReLU). For lo >= 0 the sign
// of y is the sign of z, so the backward pass reads act' from y. Written
// without branches (signs of ReLU inputs are random: branches mispredict).
inline float low_slope(Activation a, float slope) {
  return a == Activation::Identity ? 1.0f : a == Activation::ReLU ? 0.0f : slope;
}

inline int seg_of(const int32_t* seg, int64_t i) {
  return seg ? seg[i] : 0;
}

// Per-segment row counts (segment ids are checked by the caller).
std::vector<double> segment_counts(const int32_t* seg, int S, int64_t N) {
  std::vector<double> n(S, 0.0);
  if (!seg) {
    n[0] = static_cast<double>(N);
    return n;
  }
  for (int64_t i = 0; i < N; ++i) {
    n[seg[i]] += 1.0;
  }
  return n;
}

// acc[s, c] = sum over chunks (in order) of the chunk partials.
void combine(
    const std::vector<float>& part,
    int64_t chunks,
    int64_t width,
    std::vector<double>& acc) {
  acc.assign(width, 0.0);
  for (int64_t c = 0; c < chunks; ++c) {
    const float* p = part.data() + c * width;
    for (int64_t j = 0; j < width; ++j) {
      acc[j] += p[j];
    }
  }
}

// Chunk partials: fn(first row, end row, the chunk's accumulators).
template <typename F>
void chunk_sums(
    int64_t N,
    int64_t width,
    std::vector<float>& part,
    const F& fn) {
  int64_t chunks = n_chunks(N);
  part.assign(chunks * width, 0.0f);
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      fn(c * kRows, std::min(N, (c + 1) * kRows), part.data() + c * width);
    }
  });
}

template <typename T>
void forward(
    const T* x,
    const float* w,
    const float* b,
    const T* r,
    const int32_t* seg,
    const float* mean_in,
    const float* var_in,
    float* mean_out,
    float* var_out,
    T* y,
    int64_t N,
    int64_t C,
    const NormSpec& sp) {
  const int S = sp.segments;
  std::vector<float> mean(S * C), var(S * C);
  if (sp.training) {
    auto n = segment_counts(seg, S, N);
    std::vector<float> part;
    std::vector<double> acc;
    chunk_sums(N, S * C, part, [&](int64_t i0, int64_t i1, float* p) {
      std::vector<float> bv(C);
      float* __restrict buf = bv.data();
      for (int64_t i = i0; i < i1; ++i) {
        float* __restrict q = p + seg_of(seg, i) * C;
        cpu::to_float(x + i * C, buf, C);
        for (int64_t c = 0; c < C; ++c) {
          q[c] += buf[c];
        }
      }
    });
    combine(part, n_chunks(N), S * C, acc);
    for (int s = 0; s < S; ++s) {
      for (int64_t c = 0; c < C; ++c) {
        mean[s * C + c] = n[s] > 0 ? static_cast<float>(acc[s * C + c] / n[s]) : 0.0f;
      }
    }
    chunk_sums(N, S * C, part, [&](int64_t i0, int64_t i1, float* p) {
      std::vector<float> bv(C);
      float* __restrict buf = bv.data();
      for (int64_t i = i0; i < i1; ++i) {
        int s = seg_of(seg, i);
        float* __restrict q = p + s * C;
        const float* __restrict mu = mean.data() + s * C;
        cpu::to_float(x + i * C, buf, C);
        for (int64_t c = 0; c < C; ++c) {
          float d = buf[c] - mu[c];
          q[c] += d * d;
        }
      }
    });
    combine(part, n_chunks(N), S * C, acc);
    for (int s = 0; s < S; ++s) {
      for (int64_t c = 0; c < C; ++c) {
        var[s * C + c] = n[s] > 0 ? static_cast<float>(acc[s * C + c] / n[s]) : 0.0f;
      }
    }
    std::copy(mean.begin(), mean.end(), mean_out);
    std::copy(var.begin(), var.end(), var_out);
  } else {
    std::copy(mean_in, mean_in + S * C, mean.begin());
    std::copy(var_in, var_in + S * C, var.begin());
  }
  // y = act(x * scale + shift [+ r]) with scale = w / sqrt(var + eps).
  std::vector<float> scale(S * C), shift(S * C);
  for (int s = 0; s < S; ++s) {
    for (int64_t c = 0; c < C; ++c) {
      float inv = 1.0f / std::sqrt(var[s * C + c] + sp.eps);
      scale[s * C + c] = w[c] * inv;
      shift[s * C + c] = b[c] - mean[s * C + c] * w[c] * inv;
    }
  }
  const float lo = low_slope(sp.act, sp.slope);
  parallel_for(N, kRows, [&](int64_t i0, int64_t i1) {
    std::vector<float> bv(C), rv(C, 0.0f);
    float* __restrict buf = bv.data();
    float* __restrict rb = rv.data();
    const float low = lo; // a local: stores through buf cannot alias it
    for (int64_t i = i0; i < i1; ++i) {
      int s = seg_of(seg, i);
      const float* __restrict sc = scale.data() + s * C;
      const float* __restrict sh = shift.data() + s * C;
      cpu::to_float(x + i * C, buf, C);
      if (r) {
        cpu::to_float(r + i * C, rb, C);
      }
      for (int64_t c = 0; c < C; ++c) {
        float z = buf[c] * sc[c] + sh[c] + rb[c];
        buf[c] = z > 0.0f ? z : low * z;
      }
      cpu::from_float(buf, y + i * C, C);
    }
  });
}

template <typename T>
void backward(
    const T* x,
    const T* y,
    const T* ct,
    const float* w,
    const float* mean,
    const float* var,
    const int32_t* seg,
    const float* ct_mean,
    const float* ct_var,
    T* dx,
    float* dw,
    float* db,
    T* g_out,
    int64_t N,
    int64_t C,
    const NormSpec& sp) {
  const int S = sp.segments;
  const float lo = low_slope(sp.act, sp.slope);
  std::vector<float> inv(S * C);
  for (int64_t j = 0; j < S * C; ++j) {
    inv[j] = 1.0f / std::sqrt(var[j] + sp.eps);
  }
  // g = ct * act'(y); per segment A = sum g, B = sum g * xhat.
  std::vector<float> part;
  std::vector<double> acc;
  chunk_sums(N, 2 * S * C, part, [&](int64_t i0, int64_t i1, float* p) {
    std::vector<float> xv(C), yv(C), cv(C);
    float* __restrict xb = xv.data();
    float* __restrict yb = yv.data();
    float* __restrict cb = cv.data();
    const float low = lo;
    for (int64_t i = i0; i < i1; ++i) {
      int s = seg_of(seg, i);
      cpu::to_float(x + i * C, xb, C);
      cpu::to_float(y + i * C, yb, C);
      cpu::to_float(ct + i * C, cb, C);
      const float* __restrict mu = mean + s * C;
      const float* __restrict iv = inv.data() + s * C;
      float* __restrict pa = p + s * C;
      float* __restrict pb = p + (S + s) * C;
#pragma GCC ivdep
      for (int64_t c = 0; c < C; ++c) {
        float g = cb[c] * (low + (1.0f - low) * static_cast<float>(yb[c] > 0.0f));
        pa[c] += g;
        pb[c] += g * ((xb[c] - mu[c]) * iv[c]);
      }
    }
  });
  combine(part, n_chunks(N), 2 * S * C, acc);
  for (int64_t c = 0; c < C; ++c) {
    double sa = 0.0, sb = 0.0;
    for (int s = 0; s < S; ++s) {
      sa += acc[s * C + c];
      sb += acc[(S + s) * C + c];
    }
    db[c] = static_cast<float>(sa);
    dw[c] = static_cast<float>(sb);
  }
  // dx = w inv (g - A/n - xhat B/n) + ct_mean/n + 2 ct_var (x - mean)/n
  // (training); dx = w inv g (eval).
  std::vector<float> k0(S * C), k1(S * C), k2(S * C), k3(S * C), k4(S * C);
  auto n = segment_counts(seg, S, N);
  for (int s = 0; s < S; ++s) {
    double rn = n[s] > 0 ? 1.0 / n[s] : 0.0;
    for (int64_t c = 0; c < C; ++c) {
      int64_t j = s * C + c;
      k0[j] = w[c] * inv[j];
      if (sp.training) {
        k1[j] = static_cast<float>(acc[j] * rn);            // A / n
        k2[j] = static_cast<float>(acc[S * C + j] * rn);    // B / n
        k3[j] = static_cast<float>(ct_var[j] * 2.0 * rn);   // 2 ct_var / n
        k4[j] = static_cast<float>(ct_mean[j] * rn);        // ct_mean / n
      }
    }
  }
  parallel_for(N, kRows, [&](int64_t i0, int64_t i1) {
    std::vector<float> xv(C), yv(C), cv(C), gv(C);
    float* __restrict xb = xv.data();
    float* __restrict yb = yv.data();
    float* __restrict cb = cv.data();
    float* __restrict gb = gv.data();
    const float low = lo;
    for (int64_t i = i0; i < i1; ++i) {
      int s = seg_of(seg, i);
      cpu::to_float(x + i * C, xb, C);
      cpu::to_float(y + i * C, yb, C);
      cpu::to_float(ct + i * C, cb, C);
      const float* __restrict f0 = k0.data() + s * C;
      for (int64_t c = 0; c < C; ++c) {
        gb[c] = cb[c] * (low + (1.0f - low) * static_cast<float>(yb[c] > 0.0f));
      }
      if (g_out) {
        cpu::from_float(gb, g_out + i * C, C);
      }
      if (sp.training) {
        const float* __restrict mu = mean + s * C;
        const float* __restrict iv = inv.data() + s * C;
        const float* __restrict f1 = k1.data() + s * C;
        const float* __restrict f2 = k2.data() + s * C;
        const float* __restrict f3 = k3.data() + s * C;
        const float* __restrict f4 = k4.data() + s * C;
        for (int64_t c = 0; c < C; ++c) {
          float d = xb[c] - mu[c];
          gb[c] = f0[c] * (gb[c] - f1[c] - d * iv[c] * f2[c]) + f3[c] * d + f4[c];
        }
      } else {
        for (int64_t c = 0; c < C; ++c) {
          gb[c] *= f0[c];
        }
      }
      cpu::from_float(gb, dx + i * C, C);
    }
  });
}

mx::array dense(const mx::array& a, mx::Dtype dt, mx::Stream s) {
  return mx::contiguous(mx::astype(a, dt, s), false, s);
}

mx::array& alloc(mx::array& a) {
  a.set_data(mx::allocator::malloc(a.nbytes()));
  return a;
}

} // namespace

// ---------------------------------------------------------------- NormAct

void NormAct::eval_cpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : in) {
    enc.set_input_array(a);
  }
  for (auto& o : out) {
    enc.set_output_array(alloc(o));
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
  cpu::dispatch_float(x.dtype(), [&]<typename T>() {
    enc.dispatch([xp = x.data<T>(),
                  wp = in[1].data<float>(),
                  bp = in[2].data<float>(),
                  rp = r ? r->data<T>() : nullptr,
                  sp = seg ? seg->data<int32_t>() : nullptr,
                  mi = mean_in ? mean_in->data<float>() : nullptr,
                  vi = var_in ? var_in->data<float>() : nullptr,
                  mo = spec_.training ? out[1].data<float>() : nullptr,
                  vo = spec_.training ? out[2].data<float>() : nullptr,
                  yp = out[0].data<T>(),
                  N,
                  C,
                  spec = spec_]() {
      forward<T>(xp, wp, bp, rp, sp, mi, vi, mo, vo, yp, N, C, spec);
    });
  });
}

void NormAct::eval_gpu(
    const std::vector<mx::array>&,
    std::vector<mx::array>&) {
  throw std::runtime_error(
      "norm_act runs on the CPU only (the GPU layers use MLX ops)");
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
  std::vector<mx::array> in = {
      dense(x, x.dtype(), s), outputs[0], dense(cotangents[0], x.dtype(), s), w};
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
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : in) {
    enc.set_input_array(a);
  }
  for (auto& o : out) {
    enc.set_output_array(alloc(o));
  }
  const auto& x = in[0];
  const int64_t N = x.shape(0), C = x.shape(1);
  int next = 6;
  const mx::array* seg = spec_.segmented ? &in[next++] : nullptr;
  const mx::array* cm = spec_.training ? &in[next++] : nullptr;
  const mx::array* cv = spec_.training ? &in[next++] : nullptr;
  cpu::dispatch_float(x.dtype(), [&]<typename T>() {
    enc.dispatch([xp = x.data<T>(),
                  yp = in[1].data<T>(),
                  cp = in[2].data<T>(),
                  wp = in[3].data<float>(),
                  mp = in[4].data<float>(),
                  vp = in[5].data<float>(),
                  sp = seg ? seg->data<int32_t>() : nullptr,
                  cmp = cm ? cm->data<float>() : nullptr,
                  cvp = cv ? cv->data<float>() : nullptr,
                  dx = out[0].data<T>(),
                  dw = out[1].data<float>(),
                  db = out[2].data<float>(),
                  gp = spec_.residual ? out[3].data<T>() : nullptr,
                  N,
                  C,
                  spec = spec_]() {
      backward<T>(
          xp, yp, cp, wp, mp, vp, sp, cmp, cvp, dx, dw, db, gp, N, C, spec);
    });
  });
}

void NormActGrad::eval_gpu(
    const std::vector<mx::array>&,
    std::vector<mx::array>&) {
  throw std::runtime_error(
      "norm_act runs on the CPU only (the GPU layers use MLX ops)");
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
