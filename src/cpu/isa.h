// Instruction-set paths of the CPU kernels and the function table through
// which they are called. The extension carries every path its architecture
// has (x86-64: baseline, avx2, avx512; arm64: neon), each compiled from the
// same kernel sources into namespace mlx_lattice::cpu::<path>; the best path
// the CPU supports is chosen at load time (CPUID / hwcaps), unless
// MLX_LATTICE_CPU_ISA names one. This header needs no MLX.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/adam.h"

namespace mlx_lattice::cpu {

// Feature dtypes the kernels read and write.
enum class Float : int { f32, f16, bf16 };

// CSR rows of a relation view; `offsets == nullptr` means identity
// (row r has the single edge (gather r, offset 0)).
struct CsrView {
  const int32_t* offsets = nullptr;
  const int32_t* gather = nullptr;
  const int32_t* k = nullptr;
  int64_t rows = 0;
  int64_t edges = 0;
  // The row-major traversal (cpu.row_gather) instead of edges grouped by
  // offset: the same sums, for narrow inputs.
  bool row_major = false;
  // The same edges grouped by offset once for the relation
  // (Relation::offset_groups): offset k's are group_rows / group_gather
  // [segments[2k], segments[2k + 1]), rows ascending. Null: the kernel
  // groups each block's edges itself.
  const int32_t* segments = nullptr;
  const int32_t* group_rows = nullptr;
  const int32_t* group_gather = nullptr;
};

// Element strides of a (K, A, B) weight (kernel offset, input channel,
// output channel): {A * B, B, 1} row-major; {A, 1, K * A} for the
// (C_out, Kx, Ky, Kz, C_in) parameter itself, read as (K, C_in, C_out).
struct WeightStrides {
  int64_t k = 0;
  int64_t a = 0;
  int64_t b = 1;
};

// Kernel-major pairs: for offset k, edges [offsets[k], offsets[k+1]) pair
// gather row g[e] of x with row r[e] of ct. identity: K = 1, g = r = e.
struct PairView {
  const int32_t* offsets = nullptr;
  const int32_t* g = nullptr;
  const int32_t* r = nullptr;
  int64_t k = 1;
  int64_t edges = 0;
};

// A (patches, heads, P, D) tensor read through its element strides (so the
// transposed views of a qkv projection are read in place).
struct StridedView {
  const void* data = nullptr;
  int64_t strides[4] = {};
};

// Shape of a patch attention: q, k, v, o of (patches, heads, P, D).
struct AttentionShape {
  int64_t patches = 0;
  int heads = 0;
  int P = 0;
  int D = 0;
  float scale = 1.0f;
};

// A fused normalisation + activation over N rows of C channels: `segments`
// sets of statistics (per-row segment ids, or one set when they are null),
// computed from the rows (training) or given; y = z > 0 ? z : low * z.
struct NormShape {
  int64_t N = 0;
  int64_t C = 0;
  int segments = 1;
  bool training = true;
  float low = 1.0f;
  float eps = 1e-5f;
  // Row stride of the backward pass's cotangent in elements (0: C), so a
  // column slice of a wider array (a concatenation's gradient) is read in
  // place.
  int64_t ct_ld = 0;
};

using mlx_lattice::AdamCoefficients; // core/adam.h

// One path's kernels on raw rows (row-major, features of dtype t):
//   gather_conv: y (v.rows, B) = per-row sum of x[gather] @ w[k];
//                x (n_x, A), w (K, A, B) read through its strides.
//   gather_conv_quantized: the same with affine-quantized weights (MLX
//                packing, logical shape (B, K, A), scales/biases of dtype s).
//   weight_grad: out (v.k, A, B) = per-offset sum of x[g]^T ct[r],
//                written through the strides `os` (any dense layout).
//   grouped_conv, grouped_weight_grad: the same with `groups` groups of
//                channels, w and out (K, A / groups, B).
//   attention_forward: o (contiguous, dtype t) and lse (float32,
//                (patches, heads, P)) of softmax(scale q k^T) v over the
//                first lengths[patch] keys and queries of each patch.
//   attention_backward: dq, dk, dv (contiguous) from o, lse and the
//                cotangents dout, dlse (contiguous float32).
//   norm_forward: y (and, training, the float32 (segments, C) mean and
//                biased var) of y = act(w (x - mean) / sqrt(var + eps) + b
//                [+ r]); statistics, w and b are float32.
//   norm_backward: dx, dw, db (and g = ct * act'(z) for a residual) from x,
//                y (read only with a residual: z's sign is recomputed from
//                x, w and b otherwise), the cotangent ct (rows n.ct_ld
//                apart) and, training, the statistics' cotangents ct_mean,
//                ct_var.
//   adam_update: p_out, m_out, v_out of n float32 elements from the gradient
//                g, the parameter p and the moments m, v; scalars holds the
//                learning rate (lr / (1 - b1^t) with bias correction),
//                1 / sqrt(1 - b2^t) and the decay factor 1 - lr * decay.
struct KernelTable {
  const char* name;
  void (*gather_conv)(
      Float t, const void* x, const void* w, WeightStrides ws, CsrView v,
      int64_t n_x, int64_t K, int A, int B, void* y);
  void (*gather_conv_quantized)(
      Float t, Float s, const void* x, const uint32_t* codes,
      const void* scales, const void* biases, int bits, int group,
      CsrView v, int64_t n_x, int64_t K, int A, int B, void* y);
  void (*weight_grad)(
      Float t, const void* x, const void* ct, PairView v, int64_t n_x,
      int64_t n_ct, int A, int B, WeightStrides os, void* out);
  void (*grouped_conv)(
      Float t, const void* x, const void* w, int groups, CsrView v,
      int64_t n_x, int64_t K, int A, int B, void* y);
  void (*grouped_weight_grad)(
      Float t, const void* x, const void* ct, int groups, PairView v,
      int64_t n_x, int64_t n_ct, int A, int B, void* out);
  void (*attention_forward)(
      Float t, AttentionShape a, StridedView q, StridedView k, StridedView v,
      const int32_t* lengths, void* o, float* lse);
  void (*attention_backward)(
      Float t, AttentionShape a, StridedView q, StridedView k, StridedView v,
      const int32_t* lengths, StridedView o, const float* lse,
      StridedView dout, const float* dlse, void* dq, void* dk, void* dv);
  void (*norm_forward)(
      Float t, NormShape n, const void* x, const float* w, const float* b,
      const void* r, const int32_t* seg, const float* mean_in,
      const float* var_in, float* mean_out, float* var_out, void* y);
  void (*norm_backward)(
      Float t, NormShape n, const void* x, const void* y, const void* ct,
      const float* w, const float* b, const float* mean, const float* var,
      const int32_t* seg,
      const float* ct_mean, const float* ct_var, void* dx, float* dw,
      float* db, void* g_out);
  void (*adam_update)(
      int64_t n, AdamCoefficients k, const float* scalars, const float* g,
      const float* p, const float* m, const float* v, float* p_out,
      float* m_out, float* v_out);
};

// The table of the path in use.
const KernelTable& active_kernels();

// Name of the path in use: "avx512", "avx2", "baseline" or "neon".
std::string cpu_isa();

// Paths this build carries that this CPU can run, slowest first.
std::vector<std::string> supported_isas();

// Paths this build carries, whether or not this CPU can run them.
std::vector<std::string> built_isas();

// Switches to a path; throws std::invalid_argument naming the paths this
// CPU supports if `name` is not one of them.
void set_cpu_isa(const std::string& name);

// Applies MLX_LATTICE_CPU_ISA if set (as set_cpu_isa), else the best path.
void select_cpu_isa_from_env();

} // namespace mlx_lattice::cpu
