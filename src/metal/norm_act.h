// Fused normalisation + activation on a Metal GPU (metal/norm_act.metal):
// the programs NormAct::eval_gpu and NormActGrad::eval_gpu encode over the
// primitives' own inputs and outputs (src/core/norm.h lists them). The test
// harness reads the same programs through _ext.metal_norm_program.
#pragma once

#include "core/norm.h"
#include "metal/program.h"

#include "../../metal/norm_params.h"

namespace mlx_lattice::metal {

// The kernels' parameters for N rows of C channels (block sizes included).
NormParams norm_params(const NormSpec& spec, int64_t rows, int64_t channels);

// Forward: outputs y, and in training mode mean and var (S, C); three
// steps in training (block moments, merge, apply), one in eval mode.
Program norm_forward_program(const NormSpec& spec, int64_t rows, int64_t channels, mx::Dtype dtype);

// Backward: outputs dx, dweight, dbias[, g]; three steps (block sums,
// merge into dweight / dbias and the dx coefficients, apply).
Program norm_backward_program(const NormSpec& spec, int64_t rows, int64_t channels, mx::Dtype dtype);

} // namespace mlx_lattice::metal
