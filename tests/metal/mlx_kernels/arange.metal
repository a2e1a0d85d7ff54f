// MLX's arange kernel (arange.h) for each type MLX instantiates it with.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/arange.h"

#define arange_type(tname, type) instantiate_kernel("arange" #tname, arange, type)

arange_type(uint8, uint8_t)
arange_type(uint16, uint16_t)
arange_type(uint32, uint32_t)
arange_type(uint64, uint64_t)
arange_type(int8, int8_t)
arange_type(int16, int16_t)
arange_type(int32, int32_t)
arange_type(int64, int64_t)
arange_type(float16, half)
arange_type(float32, float)
arange_type(bfloat16, bfloat16_t)
