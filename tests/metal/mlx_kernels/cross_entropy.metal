// MLX's fused cross entropy and its gradient (cross_entropy.h), and its dot
// product (dot.h), for float32, float16 and bfloat16.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/cross_entropy.h"
#include "mlx/backend/metal/kernels/dot.h"

#define ce_type(tname, T)                                                              \
  instantiate_kernel("cross_entropy_" #tname, cross_entropy, T)                         \
  instantiate_kernel("cross_entropy_vjp_" #tname, cross_entropy_vjp, T)                 \
  instantiate_kernel("dot_product_" #tname, dot_product, T, 4, 256, 8)

ce_type(float32, float)
ce_type(float16, half)
ce_type(bfloat16, bfloat16_t)
