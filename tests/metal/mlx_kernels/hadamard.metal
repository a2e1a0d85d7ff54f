// MLX's Hadamard transform kernels (hadamard.h): hadamard_n at MLX's radix
// and read widths, and hadamard_m with a 12-point codelet of the kind MLX's
// host code generates for it (a sign matrix applied to the M values).
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/defines.h"

METAL_FUNC void hadamard_radix_m(thread float* x) {
  constexpr int m = 12;
  float out[m];
  for (int i = 0; i < m; i++) {
    float acc = x[0];
    for (int j = 1; j < m; j++) {
      // A Paley-type sign pattern: a quadratic-residue test mod 11.
      const int d = (j - i + 22) % 11;
      const bool residue = d == 1 || d == 3 || d == 4 || d == 5 || d == 9;
      acc += (i == 0 || j == i || residue) ? x[j] : -x[j];
    }
    out[i] = acc;
  }
  for (int i = 0; i < m; i++) {
    x[i] = out[i];
  }
}

#include "mlx/backend/metal/kernels/hadamard.h"

#define hadamard_type(tname, T)                                                               \
  instantiate_kernel("hadamard_n_" #tname "_256", hadamard_n, T, 256, 16, 4)                   \
  instantiate_kernel("hadamard_n_" #tname "_2048_s", hadamard_n, T, 2048, 32, 8, 2)            \
  instantiate_kernel("hadamard_m_" #tname "_12", hadamard_m, T, 256, 12, 4)

hadamard_type(float32, float)
hadamard_type(float16, half)
hadamard_type(bfloat16, bfloat16_t)
