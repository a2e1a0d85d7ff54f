// MLX's masked matrix-vector kernels (gemv_masked.h), as MLX's
// gemv_masked.metal instantiates them: output and operand masks of bool,
// the value type or none, for float32, float16 and bfloat16.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/gemv_masked.h"

#define masked_one(kind, outm, outt, opm, opt, name, itype, bm, bn, sm, sn, tm, tn, nc)                \
  instantiate_kernel(#kind "_outmask_" #outm "_opmask_" #opm "_" #name "_bm" #bm "_bn" #bn "_sm" #sm   \
                     "_sn" #sn "_tm" #tm "_tn" #tn "_nc" #nc,                                         \
                     kind, itype, outt, opt, bm, bn, sm, sn, tm, tn, nc)
#define masked_type(name, itype)                                                           \
  masked_one(gemv_masked, bool_, bool, bool_, bool, name, itype, 2, 1, 4, 8, 1, 4, 0)        \
  masked_one(gemv_masked, name, itype, name, itype, name, itype, 2, 1, 2, 16, 4, 4, 1)       \
  masked_one(gemv_masked, nomask, nomask_t, bool_, bool, name, itype, 4, 1, 2, 16, 4, 4, 0)  \
  masked_one(gemv_masked, name, itype, nomask, nomask_t, name, itype, 2, 1, 4, 8, 4, 4, 1)   \
  masked_one(gemv_t_masked, bool_, bool, name, itype, name, itype, 1, 2, 8, 4, 4, 1, 0)     \
  masked_one(gemv_t_masked, nomask, nomask_t, name, itype, name, itype, 1, 4, 8, 4, 4, 4, 1)

masked_type(float32, float)
masked_type(float16, half)
masked_type(bfloat16, bfloat16_t)
