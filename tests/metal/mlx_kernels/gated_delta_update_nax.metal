// MLX's NAX gated delta-rule recurrence and its gradient
// (gated_delta_nax_ops.h, gated_delta_update_nax.h,
// gated_delta_update_nax_vjp.h), as MLX's gated_delta_update_nax.metal and
// gated_delta_update_nax_vjp.metal instantiate them: 16-step chunks at
// 128-wide heads over a sample of MLX's head counts, checkpoint intervals 1
// to 16, for float32 and bfloat16 (MLX's two), and the header's
// one-pass gradient (nax1). Its gated_delta_vjp_fused_nax0, which MLX does
// not instantiate, cannot be: it calls reduce_tile_tg with the 4 arguments
// of reduce_tile_tg0 (the strict pass says so). Language: Metal 4.0.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/gated_delta_update_nax.h"
#include "mlx/backend/metal/kernels/gated_delta_update_nax_vjp.h"

#define gdn_dims(type, dk, dv, hk, hv, ckpt)                                                                   \
  instantiate_kernel("gated_delta_fused_nax_" #type "_" #dk "_" #dv "_" #hk "_" #hv "_16_" #ckpt,              \
                     gated_delta_fused_nax, type, dk, dv, hk, hv, 16, ckpt)                                   \
  instantiate_kernel("gated_delta_vjp_fused_nax_" #type "_" #dk "_" #dv "_" #hk "_" #hv "_16_" #ckpt,          \
                     gated_delta_vjp_fused_nax, type, dk, dv, hk, hv, 16, ckpt)
#define gdn_type(type)                          \
  gdn_dims(type, 128, 128, 32, 32, 1)           \
  gdn_dims(type, 128, 128, 16, 48, 4)           \
  gdn_dims(type, 128, 128, 24, 24, 16)          \
  instantiate_kernel("gated_delta_vjp_fused_nax1_" #type "_128_128_16_32_16", gated_delta_vjp_fused_nax1, type, \
                     128, 128, 16, 32, 16)      \
  instantiate_kernel("gated_delta_dgamma_to_dg_" #type "_16", gated_delta_dgamma_to_dg, type, 16)

gdn_type(float)
gdn_type(bfloat16_t)
