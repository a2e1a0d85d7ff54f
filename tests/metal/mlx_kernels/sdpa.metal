// MLX's vector attention and the blocked attention's helpers (sdpa_vector.h,
// sdpa_blocked.h), as MLX's scaled_dot_product_attention.metal instantiates
// them: a sample of head dimensions, the two-pass and grouped forms.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/sdpa_vector.h"
#include "mlx/backend/metal/kernels/sdpa_blocked.h"

#define sdpa_type(tname, T)                                                                        \
  instantiate_kernel("sdpa_vector_" #tname "_64_64", sdpa_vector, T, 64, 64)                        \
  instantiate_kernel("sdpa_vector_" #tname "_192_128", sdpa_vector, T, 192, 128)                    \
  instantiate_kernel("sdpa_vector_2pass_1_" #tname "_128_128", sdpa_vector_2pass_1, T, 128, 128)    \
  instantiate_kernel("sdpa_vector_2pass_1_gqa_" #tname "_64_64", sdpa_vector_2pass_1_gqa, T, 64, 64, 8, 8) \
  instantiate_kernel("sdpa_vector_2pass_2_" #tname "_128", sdpa_vector_2pass_2, T, 128)             \
  instantiate_kernel("sdpa_blocked_scale_copy_" #tname, sdpa_blocked_scale_copy, T)                 \
  instantiate_kernel("sdpa_blocked_causal_mask_" #tname, sdpa_blocked_causal_mask, T)

sdpa_type(float32, float)
sdpa_type(float16, half)
sdpa_type(bfloat16, bfloat16_t)
