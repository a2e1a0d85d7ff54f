// The CPU kernels as MLX command-encoder tasks: each call binds its arrays
// and dispatches the active instruction-set path's kernel (cpu/isa.h),
// chosen when the task is encoded.
#include "cpu/kernels.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "core/threadpool.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlx_lattice::cpu {

mx::cpu::CommandEncoder&
encode_all(const std::vector<mx::array>& in, std::vector<mx::array>& out, mx::Stream s) {
  auto& enc = mx::cpu::get_command_encoder(s);
  for (const auto& a : in) {
    enc.set_input_array(a);
  }
  for (auto& a : out) {
    a.set_data(mx::allocator::malloc(a.nbytes()));
    enc.set_output_array(a);
  }
  return enc;
}

void copy_strided(const mx::array& src, mx::array& dst, mx::Stream s) {
  auto& enc = mx::cpu::get_command_encoder(s);
  enc.set_input_array(src);
  enc.set_output_array(dst);
  const int nd = src.ndim();
  if (nd == 0 || src.size() == 0) {
    enc.dispatch([sp = static_cast<const char*>(src.data<void>()),
                  dp = static_cast<char*>(dst.data<void>()),
                  n = src.size() * src.itemsize()]() { std::memcpy(dp, sp, n); });
    return;
  }
  enc.dispatch([sp = static_cast<const char*>(src.data<void>()),
                dp = static_cast<char*>(dst.data<void>()),
                shape = src.shape(),
                total = int64_t(src.size()),
                ss = src.strides(),
                ds = dst.strides(),
                size = int64_t(src.itemsize()),
                nd]() {
    // Rows along the last axis, each located from its multi-index.
    const int64_t inner = shape[nd - 1];
    const int64_t rows = total / inner;
    parallel_for(rows, std::max<int64_t>(1, 4096 / inner), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        int64_t so = 0, d_o = 0, rem = r;
        for (int i = nd - 2; i >= 0; --i) {
          const int64_t idx = rem % shape[i];
          rem /= shape[i];
          so += idx * ss[i];
          d_o += idx * ds[i];
        }
        const char* sr = sp + so * size;
        char* dr = dp + d_o * size;
        if (ss[nd - 1] == 1 && ds[nd - 1] == 1) {
          std::memcpy(dr, sr, inner * size);
        } else {
          for (int64_t j = 0; j < inner; ++j) {
            std::memcpy(dr + j * ds[nd - 1] * size, sr + j * ss[nd - 1] * size, size);
          }
        }
      }
    });
  });
}

mx::array dense(const mx::array& a, mx::Stream s) {
  if (a.flags().row_contiguous) {
    return a;
  }
  mx::array out(a.shape(), a.dtype(), nullptr, {});
  out.set_data(mx::allocator::malloc(out.nbytes()));
  copy_strided(a, out, s);
  mx::cpu::get_command_encoder(s).add_temporary(out);
  return out;
}

mx::array::Flags dense_flags(const mx::Shape& shape, const mx::Strides& strides) {
  mx::array::Flags f;
  f.contiguous = true;
  f.row_contiguous = true;
  f.col_contiguous = true;
  const int n = static_cast<int>(shape.size());
  int64_t row = 1, col = 1;
  for (int i = n - 1; i >= 0; --i) {
    f.row_contiguous = f.row_contiguous && (shape[i] == 1 || strides[i] == row);
    row *= shape[i];
  }
  for (int i = 0; i < n; ++i) {
    f.col_contiguous = f.col_contiguous && (shape[i] == 1 || strides[i] == col);
    col *= shape[i];
  }
  return f;
}

Float feature_type(mx::Dtype dt) {
  if (dt == mx::float32) {
    return Float::f32;
  }
  if (dt == mx::float16) {
    return Float::f16;
  }
  if (dt == mx::bfloat16) {
    return Float::bf16;
  }
  throw std::invalid_argument("features must be float32, float16 or bfloat16");
}

namespace {

StridedView strided(const mx::array& a) {
  StridedView v;
  v.data = a.data<void>();
  for (int i = 0; i < 4; ++i) {
    v.strides[i] = a.strides()[i];
  }
  return v;
}

void check_groups(int A, int B, int groups, const char* op) {
  if (groups < 1 || A % groups != 0 || B % groups != 0) {
    throw std::invalid_argument(
        std::string(op) + ": groups must divide both channel counts");
  }
}

WeightStrides weight_strides(const mx::array& w) {
  return {w.strides()[0], w.strides()[1], w.strides()[2]};
}

AttentionShape attention_shape(const mx::array& q, float scale) {
  return {q.shape(0), q.shape(1), q.shape(2), q.shape(3), scale};
}

} // namespace

void gather_conv(
    const mx::array& x,
    const mx::array& w,
    CsrView view,
    mx::array& out,
    mx::Stream s) {
  const Float t = feature_type(out.dtype());
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(s);
  enc.set_input_array(x);
  enc.set_input_array(w);
  enc.set_output_array(out);
  enc.dispatch([fn = active_kernels().gather_conv,
                t,
                xp = x.data<void>(),
                wp = w.data<void>(),
                ws = weight_strides(w),
                yp = out.data<void>(),
                view,
                n_x = int64_t(x.shape(0)),
                K = int64_t(w.shape(0)),
                A = int(x.shape(1)),
                B = int(w.shape(2))]() { fn(t, xp, wp, ws, view, n_x, K, A, B, yp); });
}

void gather_conv_quantized(
    const mx::array& x,
    const mx::array& codes,
    const mx::array& scales,
    const mx::array& biases,
    int bits,
    int group,
    int64_t K,
    CsrView view,
    mx::array& out,
    mx::Stream s) {
  const Float t = feature_type(out.dtype());
  const Float st = feature_type(scales.dtype());
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(s);
  for (const auto* a : {&x, &codes, &scales, &biases}) {
    enc.set_input_array(*a);
  }
  enc.set_output_array(out);
  enc.dispatch([fn = active_kernels().gather_conv_quantized,
                t,
                st,
                xp = x.data<void>(),
                cp = codes.data<uint32_t>(),
                sp = scales.data<void>(),
                bp = biases.data<void>(),
                yp = out.data<void>(),
                bits,
                group,
                view,
                n_x = int64_t(x.shape(0)),
                K,
                A = int(x.shape(1)),
                B = int(out.shape(1))]() {
    fn(t, st, xp, cp, sp, bp, bits, group, view, n_x, K, A, B, yp);
  });
}

void weight_grad(
    const mx::array& x,
    const mx::array& ct,
    PairView view,
    mx::array& out,
    mx::Stream s) {
  const Float t = feature_type(out.dtype());
  // Stored in the (C_out, K, C_in) order of the parameter it is the gradient
  // of: read back through mapped_weight's transpose it is row-contiguous, so
  // no copy runs between it and the optimizer.
  const int64_t K = out.shape(0), A = out.shape(1);
  const mx::Strides strides = {A, 1, K * A};
  out.set_data(
      mx::allocator::malloc(out.nbytes()), out.size(), strides,
      dense_flags(out.shape(), strides));
  auto& enc = mx::cpu::get_command_encoder(s);
  enc.set_input_array(x);
  enc.set_input_array(ct);
  enc.set_output_array(out);
  enc.dispatch([fn = active_kernels().weight_grad,
                t,
                xp = x.data<void>(),
                cp = ct.data<void>(),
                op = out.data<void>(),
                view,
                n_x = int64_t(x.shape(0)),
                n_ct = int64_t(ct.shape(0)),
                A = int(x.shape(1)),
                B = int(ct.shape(1)),
                os = WeightStrides{strides[0], strides[1], strides[2]}]() {
    fn(t, xp, cp, view, n_x, n_ct, A, B, os, op);
  });
}

void grouped_conv(
    const mx::array& x,
    const mx::array& w,
    int groups,
    CsrView view,
    mx::array& out,
    mx::Stream s) {
  const int A = x.shape(1);
  const int B = w.shape(2);
  check_groups(A, B, groups, "grouped_conv");
  if (w.shape(1) * groups != A) {
    throw std::invalid_argument("grouped_conv: w must be (K, A / groups, B)");
  }
  const Float t = feature_type(out.dtype());
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(s);
  enc.set_input_array(x);
  enc.set_input_array(w);
  enc.set_output_array(out);
  enc.dispatch([fn = active_kernels().grouped_conv,
                t,
                xp = x.data<void>(),
                wp = w.data<void>(),
                yp = out.data<void>(),
                groups,
                view,
                n_x = int64_t(x.shape(0)),
                K = int64_t(w.shape(0)),
                A,
                B]() { fn(t, xp, wp, groups, view, n_x, K, A, B, yp); });
}

void grouped_weight_grad(
    const mx::array& x,
    const mx::array& ct,
    int groups,
    PairView view,
    mx::array& out,
    mx::Stream s) {
  const int A = x.shape(1);
  const int B = ct.shape(1);
  check_groups(A, B, groups, "grouped_weight_grad");
  const Float t = feature_type(out.dtype());
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(s);
  enc.set_input_array(x);
  enc.set_input_array(ct);
  enc.set_output_array(out);
  enc.dispatch([fn = active_kernels().grouped_weight_grad,
                t,
                xp = x.data<void>(),
                cp = ct.data<void>(),
                op = out.data<void>(),
                groups,
                view,
                n_x = int64_t(x.shape(0)),
                n_ct = int64_t(ct.shape(0)),
                A,
                B]() { fn(t, xp, cp, groups, view, n_x, n_ct, A, B, op); });
}

void patch_attention_forward(
    const mx::array& q,
    const mx::array& k,
    const mx::array& v,
    const mx::array& lengths,
    float scale,
    mx::array& o,
    mx::array& lse,
    mx::Stream s) {
  const Float t = feature_type(q.dtype());
  o.set_data(mx::allocator::malloc(o.nbytes()));
  lse.set_data(mx::allocator::malloc(lse.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(s);
  for (const auto* a : {&q, &k, &v, &lengths}) {
    enc.set_input_array(*a);
  }
  enc.set_output_array(o);
  enc.set_output_array(lse);
  enc.dispatch([fn = active_kernels().attention_forward,
                t,
                a = attention_shape(q, scale),
                qv = strided(q),
                kv = strided(k),
                vv = strided(v),
                lp = lengths.data<int32_t>(),
                op = o.data<void>(),
                sp = lse.data<float>()]() { fn(t, a, qv, kv, vv, lp, op, sp); });
}

void patch_attention_backward(
    const std::vector<mx::array>& in,
    float scale,
    std::vector<mx::array>& out,
    mx::Stream s) {
  const Float t = feature_type(in[0].dtype());
  auto& enc = encode_all(in, out, s);
  enc.dispatch([fn = active_kernels().attention_backward,
                t,
                a = attention_shape(in[0], scale),
                qv = strided(in[0]),
                kv = strided(in[1]),
                vv = strided(in[2]),
                lp = in[3].data<int32_t>(),
                ov = strided(in[4]),
                sp = in[5].data<float>(),
                dov = strided(in[6]),
                dsp = in[7].data<float>(),
                dqp = out[0].data<void>(),
                dkp = out[1].data<void>(),
                dvp = out[2].data<void>()]() {
    fn(t, a, qv, kv, vv, lp, ov, sp, dov, dsp, dqp, dkp, dvp);
  });
}

} // namespace mlx_lattice::cpu
