// MLX's softmax and logsumexp kernels (softmax.h, logsumexp.h), as MLX's
// softmax.metal and logsumexp.metal instantiate them.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/softmax.h"
#include "mlx/backend/metal/kernels/logsumexp.h"

#define softmax_type(name, itype)                                                     \
  instantiate_kernel("block_softmax_" #name, softmax_single_row, itype)               \
  instantiate_kernel("looped_softmax_" #name, softmax_looped, itype)                  \
  instantiate_kernel("block_logsumexp_" #name, logsumexp, itype)                      \
  instantiate_kernel("looped_logsumexp_" #name, logsumexp_looped, itype)
#define softmax_precise(name, itype)                                                  \
  instantiate_kernel("block_softmax_precise_" #name, softmax_single_row, itype, float) \
  instantiate_kernel("looped_softmax_precise_" #name, softmax_looped, itype, float)

softmax_type(float32, float)
softmax_type(float16, half)
softmax_type(bfloat16, bfloat16_t)
softmax_precise(float16, half)
softmax_precise(bfloat16, bfloat16_t)
