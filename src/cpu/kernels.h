// CPU kernels behind the primitives. Every output element is computed by one
// task with a fixed summation order, so results do not depend on threads.
// Each call runs the instruction-set path in use (cpu/isa.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtypes.h"
#include "cpu/isa.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/stream.h"

namespace mlx_lattice::cpu {

namespace mx = mlx::core;

// The stream's CPU encoder with every input and output registered and each
// output given a fresh buffer: the common start of a primitive's eval_cpu
// whose outputs are all written by its task.
mx::cpu::CommandEncoder&
encode_all(const std::vector<mx::array>& in, std::vector<mx::array>& out, mx::Stream s);

// `a` itself when row-contiguous; else a dense copy, made by a task encoded
// now on s (so it runs before the caller's own task, which reads it) and
// held by the encoder until the primitive's tasks ran. The primitives take
// their inputs as they come (no Contiguous node in front of them) and copy
// here only what a kernel cannot read in place.
mx::array dense(const mx::array& a, mx::Stream s);

// Flags of an array whose strides (possibly permuted or negative) cover
// its elements without gaps or overlaps (MLX's definitions).
mx::array::Flags dense_flags(const mx::Shape& shape, const mx::Strides& strides);

// Copies the elements of `src` (any strides, in elements) into `dst` (any
// strides; the same shape) by a task encoded now on s.
void copy_strided(const mx::array& src, mx::array& dst, mx::Stream s);

using mlx_lattice::is_feature_dtype; // core/dtypes.h

// The kernels' Float of a feature dtype; throws std::invalid_argument for
// any other dtype.
Float feature_type(mx::Dtype dt);

// out (rows, B) = per-row sum of x[gather] @ w[k]; x (N, A), w (K, A, B)
// of any strides (packed into panels, so no layout is copied first).
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

// out (K, A, B) = per-offset sum of x[g]^T ct[r]; x (N, A), ct (M, B).
// out is stored in (B, K, A) order, the layout of the (C_out, K, C_in)
// parameter whose gradient it is (strides {A, 1, K * A}).
void weight_grad(
    const mx::array& x,
    const mx::array& ct,
    PairView view,
    mx::array& out,
    mx::Stream s);


// o (patches, heads, P, D) and lse (patches, heads, P) of patch attention;
// q, k, v are read through their strides, lengths is contiguous int32.
void patch_attention_forward(
    const mx::array& q,
    const mx::array& k,
    const mx::array& v,
    const mx::array& lengths,
    float scale,
    mx::array& o,
    mx::array& lse,
    mx::Stream s);

// in: q, k, v, lengths, o, lse, do, dlse; out: dq, dk, dv.
void patch_attention_backward(
    const std::vector<mx::array>& in,
    float scale,
    std::vector<mx::array>& out,
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
