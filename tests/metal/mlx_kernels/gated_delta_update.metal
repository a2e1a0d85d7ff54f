// MLX's gated delta-rule recurrence and its gradient (gated_delta_update.h,
// gated_delta_update_vjp.h), as MLX's gated_delta_update.metal and
// gated_delta_update_vjp.metal instantiate them: the sequential and fused
// chunk kernels and the sequential gradient at 128-wide heads over a sample
// of MLX's head counts (equal, grouped), for float32, float16 and bfloat16.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/gated_delta_update.h"
#include "mlx/backend/metal/kernels/gated_delta_update_vjp.h"

#define gdu_dims(type, dk, dv, hk, hv)                                                                        \
  instantiate_kernel("seq_gated_delta_" #type "_" #dk "_" #dv "_" #hk "_" #hv, gated_delta_seq, type, dk, dv,   \
                     hk, hv, 1)                                                                               \
  instantiate_kernel("gated_delta_fused_chunk_" #type "_" #dk "_" #dv "_" #hk "_" #hv "_8",                    \
                     gated_delta_fused_chunk, type, dk, dv, hk, hv, 8)                                        \
  instantiate_kernel("seq_gated_delta_vjp_" #type "_" #dk "_" #dv "_" #hk "_" #hv "_4", gated_delta_vjp_seq,   \
                     type, dk, dv, hk, hv, 4)
#define gdu_type(type)                  \
  gdu_dims(type, 128, 128, 32, 32)      \
  gdu_dims(type, 128, 128, 16, 48)

gdu_type(float)
gdu_type(float16_t)
gdu_type(bfloat16_t)
instantiate_kernel("seq_gated_delta_float_128_128_16_16_8", gated_delta_seq, float, 128, 128, 16, 16, 8)
instantiate_kernel("seq_gated_delta_vjp_bfloat16_t_128_128_16_64_16", gated_delta_vjp_seq, bfloat16_t, 128, 128,
                   16, 64, 16)
