// MLX's FFT kernels (fft.h, fft/radix.h, fft/readwrite.h), as MLX's
// fft.metal instantiates them: complex and real transforms, Rader,
// Bluestein and four-step, at two threadgroup memory sizes.
#include "mlx/backend/metal/kernels/defines.h"
#include "mlx/backend/metal/kernels/fft.h"

#define fft_kinds(mem, in_T, out_T, iname, oname)                                                    \
  instantiate_kernel("fft_mem_" #mem "_" #iname "_" #oname, fft, mem, in_T, out_T)                    \
  instantiate_kernel("rader_fft_mem_" #mem "_" #iname "_" #oname, rader_fft, mem, in_T, out_T)        \
  instantiate_kernel("bluestein_fft_mem_" #mem "_" #iname "_" #oname, bluestein_fft, mem, in_T, out_T)
#define fft_mem(mem)                                                                                         \
  fft_kinds(mem, float2, float2, float2, float2)                                                              \
  fft_kinds(mem, complex32_t, complex32_t, complex32_t, complex32_t)                                          \
  fft_kinds(mem, float, float2, float, float2)                                                                \
  fft_kinds(mem, float2, float, float2, float)                                                                \
  instantiate_kernel("four_step_mem_" #mem "_float2_float2_0_false", four_step_fft, mem, float2, float2, 0, false) \
  instantiate_kernel("four_step_mem_" #mem "_float2_float2_1_false", four_step_fft, mem, float2, float2, 1, false) \
  instantiate_kernel("four_step_mem_" #mem "_float_float2_0_true", four_step_fft, mem, float, float2, 0, true)    \
  instantiate_kernel("four_step_mem_" #mem "_float2_float_1_true", four_step_fft, mem, float2, float, 1, true)

fft_mem(256)
fft_mem(4096)
