// The constants of an Adam / AdamW update (mlx.optimizers semantics; the
// learning-rate-dependent factors come as float32 scalars at run time),
// shared by the AdamUpdate primitive (core/optim.h) and the CPU kernels.
#pragma once

namespace mlx_lattice {

struct AdamCoefficients {
  float b1 = 0.9f;
  float one_minus_b1 = 0.1f;
  float b2 = 0.999f;
  float one_minus_b2 = 0.001f;
  float eps = 1e-8f;
  bool bias_correction = false;
  bool decoupled_decay = false;
};

} // namespace mlx_lattice
