// MLX's block-masked GEMM (steel_gemm_masked.h), as MLX's
// steel_gemm_masked.metal instantiates it: output and operand masks of
// bool, of the input type and none, aligned and unaligned, at its two tile
// shapes, for float32, float16 and bfloat16; and the header's kernel with
// bool operand masks.
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"
#include "mlx/backend/metal/kernels/steel/gemm/kernels/steel_gemm_masked.h"

#define masked_one(oname, otype, pname, ptype, tname, ta, tb, iname, itype, bm, bn, bk, wm, wn, aname, mn, kname, k) \
  instantiate_kernel("steel_gemm_block_outmask_" #oname "_opmask_" #pname "_" #tname "_" #iname "_" #iname       \
                     "_bm" #bm "_bn" #bn "_bk" #bk "_wm" #wm "_wn" #wn "_MN_" #aname "_K_" #kname,                 \
                     block_masked_gemm, itype, otype, ptype, bm, bn, bk, wm, wn, ta, tb, mn, k)
#define masked_masks(tname, ta, tb, iname, itype, bm, bn, bk, wm, wn, aname, mn, kname, k)                    \
  masked_one(bool_, bool, bool_, bool, tname, ta, tb, iname, itype, bm, bn, bk, wm, wn, aname, mn, kname, k)   \
  masked_one(iname, itype, iname, itype, tname, ta, tb, iname, itype, bm, bn, bk, wm, wn, aname, mn, kname, k) \
  masked_one(nomask, nomask_t, bool_, bool, tname, ta, tb, iname, itype, bm, bn, bk, wm, wn, aname, mn, kname, k) \
  masked_one(iname, itype, nomask, nomask_t, tname, ta, tb, iname, itype, bm, bn, bk, wm, wn, aname, mn, kname, k)
#define masked_type(iname, itype)                                                           \
  masked_masks(nn, false, false, iname, itype, 32, 32, 16, 2, 2, taligned, true, taligned, true)   \
  masked_masks(nt, false, true, iname, itype, 64, 64, 16, 2, 2, naligned, false, naligned, false)  \
  masked_masks(tn, true, false, iname, itype, 32, 32, 16, 2, 2, taligned, true, naligned, false)   \
  masked_masks(tt, true, true, iname, itype, 64, 64, 16, 2, 2, naligned, false, taligned, true)

masked_type(float32, float)
masked_type(float16, half)
masked_type(bfloat16, bfloat16_t)

#define masked_bool(name, itype, ta, tb, mn, k, op)                                               \
  instantiate_kernel("steel_gemm_block_bool_" #name, block_masked_gemm, itype, 32, 32, 16, 2, 2, ta, tb, \
                     mn, k, op)
masked_bool(float32_nn_op, float, false, false, true, true, true)
masked_bool(float16_tn, half, true, false, false, false, false)
masked_bool(bfloat16_nt_op, bfloat16_t, false, true, false, true, true)
