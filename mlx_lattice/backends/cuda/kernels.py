"""CUDA kernel sources, written for ``mx.fast.cuda_kernel`` (MLX compiles
them at run time: no private MLX C++ ABI is needed). Each kernel is named
for the route that launches it (mlx_lattice/backends/cuda/routes.py).
"""

from __future__ import annotations

import functools


from . import jit


# ------------------------------------------------------------------ sources
HEADER = """
#include <mma.h>
"""

# Fetch-on-demand: one thread per (row, output channel) over the CSR edges.
# params[4] / params[5]: the weight read transposed (stored (K, B, A)) /
# its offsets mirrored (W[K - 1 - k]), as an input gradient reads it.
FETCH_ON_DEMAND_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int rows = params[0], A = params[1], B = params[2], K = params[3];
  const bool wt = params[4] != 0, mirror = params[5] != 0;
  if (idx >= (long)rows * B) return;
  const int r = (int)(idx / B);
  const int c = (int)(idx % B);
  const int e0 = POINTWISE ? r : offsets[r];
  const int e1 = POINTWISE ? r + 1 : offsets[r + 1];
  const long step = wt ? 1 : B;
  float acc = 0.0f;
  for (int e = e0; e < e1; ++e) {
    const long g = POINTWISE ? r : gather[e];
    const long k0 = POINTWISE ? 0 : kidx[e];
    const long k = mirror ? K - 1 - k0 : k0;
    const T* xr = x + g * A;
    const T* wk = w + k * A * B + (wt ? (long)c * A : (long)c);
    for (int a = 0; a < A; ++a) {
      acc += static_cast<float>(xr[a]) * static_cast<float>(wk[a * step]);
    }
  }
  y[(long)r * B + c] = static_cast<T>(acc);
"""

# Sorted implicit GEMM on tensor cores: TM rows (in neighbour-mask order) by
# BN output channels per block (B / BN blocks per tile), a warp per 16 rows
# holding BN/16 accumulator fragments. TM is 64 (ROW_TILE) or 128 (a tuner
# variant: every block reads W[k] once per offset of its mask, so taller
# tiles halve the weight traffic); the plan's masks are per 64 rows, OR-ed in
# pairs for TM = 128. For each offset present in
# the tile's mask, the input channels go by in chunks of AK: the 64 gathered
# input rows and the W[k] block are staged in shared memory with 16-byte
# loads, then contracted. Dynamic shared memory: the staged operands during
# the loop, the float output tile after it. params[4] / params[5]: the
# weight stored (K, B, A) and read transposed (its BN x AK block staged as
# it lies and multiplied as a column-major operand, so the input gradient
# needs no transposed copy) / its offsets mirrored (W[K - 1 - k]).
SORTED_MMA_SOURCE = """
  using namespace nvcuda;
  constexpr int NT = TM * 2;  // threads
  constexpr int LDX = AK + 8;
  constexpr int LDW = BN + 8;
  constexpr int LDWT = AK + 8;
  constexpr int LDO = BN + 4;
  constexpr int VA = AK / 8;
  constexpr int VB = BN / 8;
  const int rows = params[0], A = params[1], B = params[2], K = params[3];
  const bool wt = params[4] != 0, mirror = params[5] != 0;
  const int NB = B / BN;
  extern __shared__ __align__(128) unsigned char smem[];
  T* xs = reinterpret_cast<T*>(smem);
  T* ws = xs + TM * LDX;
  float* os = reinterpret_cast<float*>(smem);
  const int tile = blockIdx.x / NB;
  const int n0 = (blockIdx.x % NB) * BN;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int n64 = (rows + 63) / 64;
  unsigned long long mask = 0ull;
  for (int t = tile * (TM / 64); t < (tile + 1) * (TM / 64) && t < n64; ++t) mask |= tile_masks[t];
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[BN / 16];
  for (int j = 0; j < BN / 16; ++j) wmma::fill_fragment(acc[j], 0.0f);
  for (int k = 0; k < K; ++k) {
    if (((mask >> k) & 1ull) == 0) continue;
    const long kw = mirror ? K - 1 - k : k;
    for (int c0 = 0; c0 < A; c0 += AK) {
      __syncthreads();
      for (int i = tid; i < TM * VA; i += NT) {
        const int rr = i / VA, v = i % VA;
        const int row = tile * TM + rr;
        const int in = row < rows ? sorted_map[(long)row * K + k] : -1;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (in >= 0) val = reinterpret_cast<const uint4*>(x + (long)in * A + c0)[v];
        *reinterpret_cast<uint4*>(xs + rr * LDX + v * 8) = val;
      }
      if (wt) {
        for (int i = tid; i < BN * VA; i += NT) {
          const int br = i / VA, v = i % VA;
          *reinterpret_cast<uint4*>(ws + br * LDWT + v * 8) =
              reinterpret_cast<const uint4*>(w + (kw * B + n0 + br) * A + c0)[v];
        }
      } else {
        for (int i = tid; i < AK * VB; i += NT) {
          const int ar = i / VB, v = i % VB;
          *reinterpret_cast<uint4*>(ws + ar * LDW + v * 8) =
              reinterpret_cast<const uint4*>(w + (kw * A + c0 + ar) * B + n0)[v];
        }
      }
      __syncthreads();
      if (wt) {
        for (int a0 = 0; a0 < AK; a0 += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
          wmma::load_matrix_sync(fa, xs + warp * 16 * LDX + a0, LDX);
          for (int j = 0; j < BN / 16; ++j) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
            wmma::load_matrix_sync(fb, ws + j * 16 * LDWT + a0, LDWT);
            wmma::mma_sync(acc[j], fa, fb, acc[j]);
          }
        }
      } else {
        for (int a0 = 0; a0 < AK; a0 += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
          wmma::load_matrix_sync(fa, xs + warp * 16 * LDX + a0, LDX);
          for (int j = 0; j < BN / 16; ++j) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
            wmma::load_matrix_sync(fb, ws + a0 * LDW + j * 16, LDW);
            wmma::mma_sync(acc[j], fa, fb, acc[j]);
          }
        }
      }
    }
  }
  __syncthreads();
  for (int j = 0; j < BN / 16; ++j) {
    wmma::store_matrix_sync(os + warp * 16 * LDO + j * 16, acc[j], LDO, wmma::mem_row_major);
  }
  __syncthreads();
  for (int i = tid; i < TM * BN; i += NT) {
    const int row = tile * TM + i / BN;
    if (row < rows) {
      y[(long)reorder[row] * B + n0 + i % BN] = static_cast<T>(os[(i / BN) * LDO + i % BN]);
    }
  }
"""


def channel_tile(c: int) -> int:
    """The channels one tensor-core block covers: all of them up to 128,
    else the largest of 128, 64, 32, 16 dividing c (c a multiple of 16)."""
    if c <= 128:
        return c
    return next(t for t in (128, 64, 32, 16) if c % t == 0)


# Blocks the sorted GEMM's default output tile launches at least where it
# can: two per multiprocessor of the largest NVIDIA parts (132 on an H100 or
# H200). A deep layer has a few thousand rows, tens of 64-row tiles: with all
# of its output channels per block it ran on a fraction of the GPU, and its
# input gradients were the step's slowest products.
FILL_BLOCKS = 264


def output_tile(b: int, tiles: int) -> int:
    """The sorted GEMM's default output channels per block over ``tiles`` row
    tiles: channel_tile(b), halved (down to 16) while the launch would have
    fewer than FILL_BLOCKS blocks. Every output element sums the same
    products in the same order whatever the tile: results are the same bits."""
    bn = channel_tile(b)
    while tiles * (b // bn) < FILL_BLOCKS and bn % 32 == 0:
        bn //= 2
    return bn


def input_chunk(a: int) -> int:
    """Input channels staged at a time by the sorted GEMM: all up to 128,
    else 64-wide chunks (or the largest of 32, 16 dividing a)."""
    if a <= 128:
        return a
    return next(t for t in (64, 32, 16) if a % t == 0)


# Rows per block of the sorted GEMM by default. Measured on an H200 (subm k3
# over a 97k-voxel LiDAR sweep, float16, one process), 128-row blocks were as
# fast at C128 and 4-16% slower at C64, C256 and C512: the halved weight
# traffic does not bound these layers. The tuner may still pick 128 (a
# variant) where it wins.
ROW_TILE = 64


def sorted_mma_shared_bytes(a: int, b: int, ak: int | None = None, bn: int | None = None,
                            tm: int | None = None) -> int:
    """Dynamic shared memory of the sorted GEMM (default tiles: input_chunk(a),
    channel_tile(b), ROW_TILE)."""
    ak, bn = ak or input_chunk(a), bn or channel_tile(b)
    tm = tm or ROW_TILE
    # the weight block staged as AK x (BN + 8), or BN x (AK + 8) read transposed
    staged = tm * (ak + 8) * 2 + max(ak * (bn + 8), bn * (ak + 8)) * 2
    return max(staged, tm * (bn + 4) * 4)


# Weight gradient without tensor cores: one block row per chunk of edges
# (a slot of wgrad_chunks: edges of one offset; a pointwise product's chunk c
# is rows [c * size, (c + 1) * size)), one thread per element of dW, float
# partial sums reduced per offset, in chunk order, by WGRAD_REDUCE. Split
# over edges as well as over dW, a layer with few weights (a stem's 4 input
# channels, a classifier's 4 classes) still fills the GPU; one thread per
# element over all of an offset's edges ran a classifier's gradient in a
# single block.
_SPLIT_WGRAD = """
SIZES
  const long tiles = (AB + blockDim.x - 1) / blockDim.x;
  const long c = blockIdx.x / tiles;
  const long ab = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
  if (c >= slots || ab >= AB) return;
  const int e0 = POINTWISE ? (int)(c * size) : chunks[3 * c + 1];
  const int e1 = POINTWISE ? min(n, e0 + size) : chunks[3 * c + 2];
  const int a = (int)(ab / B), b = (int)(ab % B);
  const long col = COLUMN;
  float acc = 0.0f;
  for (int e = e0; e < e1; ++e) {
    const long g = POINTWISE ? e : gidx[e];
    const long r = POINTWISE ? e : ridx[e];
    acc += static_cast<float>(x[g * A + col]) * static_cast<float>(ct[r * B + b]);
  }
  partial[c * AB + ab] = acc;
"""
WGRAD_DIRECT_SOURCE = _SPLIT_WGRAD.replace("SIZES", """\
  const int n = params[0], A = params[1], B = params[2], slots = params[3], size = params[4];
  const long AB = (long)A * B;""").replace("COLUMN", "a")

# Weight gradient on tensor cores: one block per (chunk of edges of one
# offset, TA x TB block of dW); gathered rows of x and ct go through shared
# memory 32 edges at a time (16-byte loads), dW_chunk = X^T G accumulates in
# fragments spread over four warps. Partial sums are reduced per offset, in
# chunk order, by WGRAD_REDUCE.
WGRAD_MMA_SOURCE = """
  using namespace nvcuda;
  constexpr int SE = 32;
  constexpr int LDX = TA + 8;
  constexpr int LDG = TB + 8;
  constexpr int VA = TA / 8;
  constexpr int VB = TB / 8;
  constexpr int TILES = (TA / 16) * (TB / 16);
  constexpr int PER_WARP = (TILES + 3) / 4;
  const int A = params[0], B = params[1];
  const int NA = A / TA, NB = B / TB;
  __shared__ __align__(32) T xs[SE * LDX];
  __shared__ __align__(32) T gs[SE * LDG];
  const int chunk = blockIdx.x / (NA * NB);
  const int a0 = ((blockIdx.x / NB) % NA) * TA;
  const int b0 = (blockIdx.x % NB) * TB;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int e0 = chunks[3 * chunk + 1];
  const int e1 = chunks[3 * chunk + 2];
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[PER_WARP];
  for (int t = 0; t < PER_WARP; ++t) wmma::fill_fragment(acc[t], 0.0f);
  for (int s = e0; s < e1; s += SE) {
    __syncthreads();
    for (int i = tid; i < SE * VA; i += 128) {
      const int e = s + i / VA, v = i % VA;
      uint4 val = make_uint4(0u, 0u, 0u, 0u);
      if (e < e1) val = reinterpret_cast<const uint4*>(x + (long)gidx[e] * A + a0)[v];
      *reinterpret_cast<uint4*>(xs + (i / VA) * LDX + v * 8) = val;
    }
    for (int i = tid; i < SE * VB; i += 128) {
      const int e = s + i / VB, v = i % VB;
      uint4 val = make_uint4(0u, 0u, 0u, 0u);
      if (e < e1) val = reinterpret_cast<const uint4*>(ct + (long)ridx[e] * B + b0)[v];
      *reinterpret_cast<uint4*>(gs + (i / VB) * LDG + v * 8) = val;
    }
    __syncthreads();
    for (int kk = 0; kk < SE; kk += 16) {
      for (int t = 0; t < PER_WARP; ++t) {
        const int tile = warp * PER_WARP + t;
        if (tile >= TILES) break;
        const int ta = tile / (TB / 16), tb = tile % (TB / 16);
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, xs + kk * LDX + ta * 16, LDX);
        wmma::load_matrix_sync(fb, gs + kk * LDG + tb * 16, LDG);
        wmma::mma_sync(acc[t], fa, fb, acc[t]);
      }
    }
  }
  float* out = partial + (long)chunk * A * B + (long)a0 * B + b0;
  for (int t = 0; t < PER_WARP; ++t) {
    const int tile = warp * PER_WARP + t;
    if (tile >= TILES) break;
    const int ta = tile / (TB / 16), tb = tile % (TB / 16);
    wmma::store_matrix_sync(out + ta * 16 * B + tb * 16, acc[t], B, wmma::mem_row_major);
  }
"""

WGRAD_REDUCE_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const long AB = (long)params[0] * params[1];
  const int K = params[2];
  if (idx >= K * AB) return;
  const int k = (int)(idx / AB);
  const long ab = idx % AB;
  float acc = 0.0f;
  for (int c = first[k]; c < first[k + 1]; ++c) acc += partial[(long)c * AB + ab];
  dw[idx] = static_cast<T>(acc);
"""

# Grouped products (groups > 1): W is (K, AG, B); output channel c reads the
# AG input channels of its group, from (c / (B / G)) * AG, of x's A.
# One thread per (row, output channel) over the CSR edges.
GROUPED_FETCH_ON_DEMAND_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int rows = params[0];
  if (idx >= (long)rows * B) return;
  const int r = (int)(idx / B);
  const int c = (int)(idx % B);
  const int first = (c / (B / G)) * AG;
  const int e0 = POINTWISE ? r : offsets[r];
  const int e1 = POINTWISE ? r + 1 : offsets[r + 1];
  float acc = 0.0f;
  for (int e = e0; e < e1; ++e) {
    const long g = POINTWISE ? r : gather[e];
    const long k = POINTWISE ? 0 : kidx[e];
    const T* xr = x + g * A + first;
    const T* wk = w + k * AG * B + c;
    for (int a = 0; a < AG; ++a) {
      acc += static_cast<float>(xr[a]) * static_cast<float>(wk[(long)a * B]);
    }
  }
  y[(long)r * B + c] = static_cast<T>(acc);
"""

# dW (K, AG, B) of a grouped product, split over chunks of edges as
# WGRAD_DIRECT: element (a, b) reads input channel (b / (B / G)) * AG + a.
GROUPED_WGRAD_SOURCE = _SPLIT_WGRAD.replace("SIZES", """\
  const int n = params[0], slots = params[1], size = params[2];
  constexpr long AB = (long)AG * B;""").replace("COLUMN", "(long)(b / (B / G)) * AG + a")


@functools.lru_cache(maxsize=None)
def _kernel(name: str, shared_memory: int = 0):
    spec = {
        "fetch_on_demand": (["x", "w", "offsets", "gather", "kidx", "params"], ["y"], FETCH_ON_DEMAND_SOURCE),
        "sorted_mma": (["x", "w", "reorder", "sorted_map", "tile_masks", "params"], ["y"], SORTED_MMA_SOURCE),
        "wgrad_direct": (["x", "ct", "chunks", "gidx", "ridx", "params"], ["partial"], WGRAD_DIRECT_SOURCE),
        "wgrad_mma": (["x", "ct", "gidx", "ridx", "chunks", "params"], ["partial"], WGRAD_MMA_SOURCE),
        "wgrad_reduce": (["partial", "first", "params"], ["dw"], WGRAD_REDUCE_SOURCE),
        "grouped_fetch_on_demand": (
            ["x", "w", "offsets", "gather", "kidx", "params"], ["y"], GROUPED_FETCH_ON_DEMAND_SOURCE,
        ),
        "grouped_wgrad": (["x", "ct", "chunks", "gidx", "ridx", "params"], ["partial"], GROUPED_WGRAD_SOURCE),
    }[name]
    return jit.kernel(
        name=f"mlx_lattice_{name}", input_names=spec[0], output_names=spec[1], source=spec[2],
        header=HEADER, shared_memory=shared_memory,
    )
