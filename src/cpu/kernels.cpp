// The CPU kernels as MLX command-encoder tasks: each call binds its arrays
// and dispatches the active instruction-set path's kernel (cpu/isa.h),
// chosen when the task is encoded.
#include "cpu/kernels.h"

#include <stdexcept>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlx_lattice::cpu {

namespace {

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
                yp = out.data<void>(),
                view,
                n_x = int64_t(x.shape(0)),
                K = int64_t(w.shape(0)),
                A = int(x.shape(1)),
                B = int(w.shape(2))]() { fn(t, xp, wp, view, n_x, K, A, B, yp); });
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
  out.set_data(mx::allocator::malloc(out.nbytes()));
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
                B = int(ct.shape(1))]() { fn(t, xp, cp, view, n_x, n_ct, A, B, op); });
}

} // namespace mlx_lattice::cpu
