// Patch attention: softmax(scale * q k^T) v inside each patch, keys past the
// patch's valid length masked out.
//
// PatchAttention: q, k, v (patches, heads, P, D) and lengths (patches,)
// int32 -> o (patches, heads, P, D) and the per-query log-sum-exp of the
// scaled scores (patches, heads, P) float32 (kept for the backward). Rows at
// or past a patch's length (padding) get o = 0 and lse = 0.
// PatchAttentionGrad: q, k, v, lengths, o, lse, do, dlse -> dq, dk, dv.
// CPU only; on the GPU the Python layer calls
// mx.fast.scaled_dot_product_attention.
#pragma once

#include <vector>

#include "core/primitive_decl.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

namespace mlx_lattice {

namespace mx = mlx::core;

class PatchAttention : public mx::Primitive {
 public:
  PatchAttention(mx::Stream s, float scale) : mx::Primitive(s), scale_(scale) {}

  LATTICE_EVAL()
  LATTICE_JVP()
  LATTICE_VJP()
  LATTICE_OUTPUT_SHAPES()
  LATTICE_NAME("PatchAttention")
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  float scale_;
};

class PatchAttentionGrad : public mx::Primitive {
 public:
  PatchAttentionGrad(mx::Stream s, float scale)
      : mx::Primitive(s), scale_(scale) {}

  LATTICE_EVAL()
  LATTICE_JVP()
  LATTICE_VJP()
  LATTICE_OUTPUT_SHAPES()
  LATTICE_NAME("PatchAttentionGrad")
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  float scale_;
};

// [o, lse] of patch attention; the stream must be a CPU stream.
std::vector<mx::array> patch_attention(
    const mx::array& q,
    const mx::array& k,
    const mx::array& v,
    const mx::array& lengths,
    float scale,
    mx::StreamOrDevice s = {});

} // namespace mlx_lattice
