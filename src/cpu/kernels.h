// CPU kernels behind the primitives. Every output element is computed by one
// task with a fixed summation order, so results do not depend on threads.
#pragma once

#include <cstdint>

#include "mlx/array.h"
#include "mlx/stream.h"

namespace mlx_lattice::cpu {

namespace mx = mlx::core;

// CSR rows of a relation view; `offsets == nullptr` means identity
// (row r has the single edge (gather r, offset 0)).
struct CsrView {
  const int32_t* offsets = nullptr;
  const int32_t* gather = nullptr;
  const int32_t* k = nullptr;
  int64_t rows = 0;
  int64_t edges = 0;
};

// out (rows, B) = per-row sum of x[gather] @ w[k]; x (N, A), w (K, A, B).
void gather_conv(
    const mx::array& x,
    const mx::array& w,
    CsrView view,
    mx::array& out,
    mx::Stream s);

// As gather_conv, with affine-quantized weights (MLX packing) of logical
// shape (C_out, K, C_in), unpacked into the kernel's float32 weight panels.
void gather_conv_quantized(
    const mx::array& x,
    const mx::array& codes,
    const mx::array& scales,
    const mx::array& biases,
    int bits,
    int group,
    int64_t K,
    CsrView view,
    mx::array& out,
    mx::Stream s);

// Kernel-major pairs: for offset k, edges [offsets[k], offsets[k+1]) pair
// gather row g[e] of x with row r[e] of ct. identity: K = 1, g = r = e.
struct PairView {
  const int32_t* offsets = nullptr;
  const int32_t* g = nullptr;
  const int32_t* r = nullptr;
  int64_t k = 1;
  int64_t edges = 0;
};

// out (K, A, B) = per-offset sum of x[g]^T ct[r]; x (N, A), ct (M, B).
void weight_grad(
    const mx::array& x,
    const mx::array& ct,
    PairView view,
    mx::array& out,
    mx::Stream s);

// Grouped products (src/cpu/grouped_conv.cpp): w (K, A / groups, B); output
// channel c of B reads the inputs of its group (c / (B / groups)).
void grouped_conv(
    const mx::array& x,
    const mx::array& w,
    int groups,
    CsrView view,
    mx::array& out,
    mx::Stream s);

// out (K, A / groups, B): the grouped product's weight gradient.
void grouped_weight_grad(
    const mx::array& x,
    const mx::array& ct,
    int groups,
    PairView view,
    mx::array& out,
    mx::Stream s);

} // namespace mlx_lattice::cpu
