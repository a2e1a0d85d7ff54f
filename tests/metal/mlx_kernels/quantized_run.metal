// MLX's affine quantized matmul (x @ dequantize(w)^T, quantized.h's
// affine_qmm_t) for the executor's runs: float32, float16 and bfloat16,
// group size 64, 4 and 8 bits, N aligned to the tile or not.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"
#include "mlx/backend/metal/kernels/quantized_utils.h"
#include "mlx/backend/metal/kernels/quantized.h"

#define qmm_t(tname, type, bits, aligned)                                                  \
  instantiate_kernel("affine_qmm_t_" #tname "_gs_64_b_" #bits "_alN_" #aligned "_batch_0",  \
                     affine_qmm_t, type, 64, bits, aligned, false)
#define qmm_t_type(tname, type) \
  qmm_t(tname, type, 4, true)   \
  qmm_t(tname, type, 4, false)  \
  qmm_t(tname, type, 8, false)

qmm_t_type(float32, float)
qmm_t_type(float16, float16_t)
qmm_t_type(bfloat16, bfloat16_t)
