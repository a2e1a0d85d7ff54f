"""CUDA kernel sources, written for ``mx.fast.cuda_kernel`` (MLX compiles
them at run time: no private MLX C++ ABI is needed). Each kernel is named
for the route that launches it (mlx_lattice/backends/cuda/routes.py).
"""

from __future__ import annotations

from . import jit


# ------------------------------------------------------------------ sources
HEADER = """
#include <mma.h>

// 16 bytes global -> shared without passing through registers; src_bytes 0
// fills zeros (a row with no neighbour at this offset).
__device__ __forceinline__ void lattice_cp_async16(void* dst, const void* src, int src_bytes) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\\n" :: "r"(s), "l"(src), "r"(src_bytes));
}
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
# the tile's mask, the input channels go by in chunks of AK: the gathered
# input rows and the W[k] block of the next chunk are copied into shared
# memory asynchronously (cp.async, 16 bytes at a time, zeros for rows without
# that neighbour) while the current chunk is contracted. Two stages were
# 10-22% faster than one at C64-512 (H200). Dynamic shared memory: the two
# stages during the loop, the float output tile after it. params[4] / params[5]: the
# weight stored (K, B, A) and read transposed (its BN x AK block staged as
# it lies and multiplied as a column-major operand, so the input gradient
# needs no transposed copy) / its offsets mirrored (W[K - 1 - k]).
# params[6]: a pointwise product (cuda.pointwise_mma): row r reads input row
# r, through offset 0 only, and the plan's arrays are not read.
SORTED_MMA_SOURCE = """
  using namespace nvcuda;
  constexpr int NT = TM * 2;  // threads
  constexpr int LDX = AK + 8;
  constexpr int LDW = BN + 8;
  constexpr int LDWT = AK + 8;
  constexpr int LDO = BN + 4;
  constexpr int VA = AK / 8;
  constexpr int VB = BN / 8;
  constexpr int XS = TM * LDX;  // one staged x tile, elements
  constexpr int WS = (AK * LDW > BN * LDWT) ? AK * LDW : BN * LDWT;  // one staged W block
  const int rows = params[0], A = params[1], B = params[2], K = params[3];
  const bool wt = params[4] != 0, mirror = params[5] != 0;
  const bool pointwise = params[6] != 0;  // rows in order, each its own input row, one offset
  const int NB = B / BN;
  extern __shared__ __align__(128) unsigned char smem[];
  T* staged = reinterpret_cast<T*>(smem);  // two buffers of XS + WS
  float* os = reinterpret_cast<float*>(smem);
  const int tile = blockIdx.x / NB;
  const int n0 = (blockIdx.x % NB) * BN;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int n64 = (rows + 63) / 64;
  unsigned long long mask = pointwise ? 1ull : 0ull;
  for (int t = tile * (TM / 64); !pointwise && t < (tile + 1) * (TM / 64) && t < n64; ++t) mask |= tile_masks[t];
  // Stages (k, c0): the offsets of the mask in order, AK input channels at
  // a time. The next stage's rows and W block are copied asynchronously into
  // the other buffer while this one multiplies.
  auto issue = [&](int buf, int k, int c0) {
    T* xs = staged + buf * (XS + WS);
    T* ws = xs + XS;
    const long kw = mirror ? K - 1 - k : k;
    for (int i = tid; i < TM * VA; i += NT) {
      const int rr = i / VA, v = i % VA;
      const int row = tile * TM + rr;
      const int in = row >= rows ? -1 : pointwise ? row : sorted_map[(long)row * K + k];
      lattice_cp_async16(xs + rr * LDX + v * 8, in >= 0 ? x + (long)in * A + c0 + v * 8 : x, in >= 0 ? 16 : 0);
    }
    if (wt) {
      for (int i = tid; i < BN * VA; i += NT) {
        const int br = i / VA, v = i % VA;
        lattice_cp_async16(ws + br * LDWT + v * 8, w + (kw * B + n0 + br) * A + c0 + v * 8, 16);
      }
    } else {
      for (int i = tid; i < AK * VB; i += NT) {
        const int ar = i / VB, v = i % VB;
        lattice_cp_async16(ws + ar * LDW + v * 8, w + (kw * A + c0 + ar) * B + n0 + v * 8, 16);
      }
    }
    asm volatile("cp.async.commit_group;\\n" ::);
  };
  auto next_offset = [&](int k) {  // the mask's next offset after k, K when none
    const unsigned long long rest = k + 1 < 64 ? mask >> (k + 1) : 0ull;
    return rest ? k + __ffsll((long long)rest) : K;
  };
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[BN / 16];
  for (int j = 0; j < BN / 16; ++j) wmma::fill_fragment(acc[j], 0.0f);
  int k = next_offset(-1), c0 = 0, buf = 0;
  if (k < K) issue(0, k, 0);
  while (k < K) {
    int nk = k, nc = c0 + AK;
    if (nc >= A) {
      nc = 0;
      nk = next_offset(k);
    }
    if (nk < K) {
      issue(buf ^ 1, nk, nc);
      asm volatile("cp.async.wait_group 1;\\n" ::);
    } else {
      asm volatile("cp.async.wait_group 0;\\n" ::);
    }
    __syncthreads();
    const T* xs = staged + buf * (XS + WS);
    const T* ws = xs + XS;
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
    __syncthreads();  // this buffer is refilled two stages on
    k = nk;
    c0 = nc;
    buf ^= 1;
  }
  for (int j = 0; j < BN / 16; ++j) {
    wmma::store_matrix_sync(os + warp * 16 * LDO + j * 16, acc[j], LDO, wmma::mem_row_major);
  }
  __syncthreads();
  for (int i = tid; i < TM * BN; i += NT) {
    const int row = tile * TM + i / BN;
    if (row < rows) {
      y[(long)(pointwise ? row : reorder[row]) * B + n0 + i % BN] = static_cast<T>(os[(i / BN) * LDO + i % BN]);
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
    """Dynamic shared memory of the sorted GEMM (default tiles:
    staged_chunk(a, bn, tm), channel_tile(b), ROW_TILE)."""
    bn, tm = bn or channel_tile(b), tm or ROW_TILE
    ak = ak or staged_chunk(a, bn, tm)
    # the two stages, or the float output tile after them
    return max(_staged_bytes(ak, bn, tm), tm * (bn + 4) * 4)


def _staged_bytes(ak: int, bn: int, tm: int) -> int:
    """Two stages of the x tile and the weight block (AK x (BN + 8), or
    BN x (AK + 8) read transposed), half-precision."""
    return 2 * (tm * (ak + 8) + max(ak * (bn + 8), bn * (ak + 8))) * 2


# Shared memory the default input chunk keeps the sorted GEMM's two stages
# within: four 64 x 128 blocks fit an H100/H200 multiprocessor at once.
STAGED_LIMIT = 64 << 10


def staged_chunk(a: int, bn: int, tm: int = ROW_TILE) -> int:
    """The sorted GEMM's default input channels per stage: input_chunk(a),
    halved (while it stays a multiple of 16 dividing a) while its two
    stages would pass STAGED_LIMIT."""
    ak = input_chunk(a)
    while (ak // 2) % 16 == 0 and a % (ak // 2) == 0 and _staged_bytes(ak, bn, tm) > STAGED_LIMIT:
        ak //= 2
    return ak


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
# chunk order, by WGRAD_REDUCE. A pointwise product's edges are its rows, in
# chunks of params[4] (cuda.pointwise_wgrad_mma).
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
  // pointwise (params[2]): chunk c is rows [c * size, (c + 1) * size) of n,
  // each row its own edge
  const bool pointwise = params[2] != 0;
  const int n = params[3], size = params[4];
  const int NA = A / TA, NB = B / TB;
  __shared__ __align__(32) T xs[SE * LDX];
  __shared__ __align__(32) T gs[SE * LDG];
  const int chunk = blockIdx.x / (NA * NB);
  const int a0 = ((blockIdx.x / NB) % NA) * TA;
  const int b0 = (blockIdx.x % NB) * TB;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int e0 = pointwise ? chunk * size : chunks[3 * chunk + 1];
  const int e1 = pointwise ? min(n, e0 + size) : chunks[3 * chunk + 2];
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[PER_WARP];
  for (int t = 0; t < PER_WARP; ++t) wmma::fill_fragment(acc[t], 0.0f);
  for (int s = e0; s < e1; s += SE) {
    __syncthreads();
    for (int i = tid; i < SE * VA; i += 128) {
      const int e = s + i / VA, v = i % VA;
      uint4 val = make_uint4(0u, 0u, 0u, 0u);
      if (e < e1) val = reinterpret_cast<const uint4*>(x + (long)(pointwise ? e : gidx[e]) * A + a0)[v];
      *reinterpret_cast<uint4*>(xs + (i / VA) * LDX + v * 8) = val;
    }
    for (int i = tid; i < SE * VB; i += 128) {
      const int e = s + i / VB, v = i % VB;
      uint4 val = make_uint4(0u, 0u, 0u, 0u);
      if (e < e1) val = reinterpret_cast<const uint4*>(ct + (long)(pointwise ? e : ridx[e]) * B + b0)[v];
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

# dW is written as the parameter lies, (B, K, A) (B, Kx, Ky, Kz, A flattened):
# the route returns its (K, A, B) transposed view, which the parameter's
# gradient undoes without a copy.
WGRAD_REDUCE_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int A = params[0], B = params[1];
  const long AB = (long)A * B;
  const int K = params[2];
  if (idx >= K * AB) return;
  const int k = (int)(idx / AB);
  const long ab = idx % AB;
  float acc = 0.0f;
  for (int c = first[k]; c < first[k + 1]; ++c) acc += partial[(long)c * AB + ab];
  dw[((ab % B) * K + k) * A + ab / B] = static_cast<T>(acc);
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


_kernel = jit.Family("mlx_lattice_", {
    "fetch_on_demand": (["x", "w", "offsets", "gather", "kidx", "params"], ["y"], FETCH_ON_DEMAND_SOURCE),
    "sorted_mma": (["x", "w", "reorder", "sorted_map", "tile_masks", "params"], ["y"], SORTED_MMA_SOURCE),
    "wgrad_direct": (["x", "ct", "chunks", "gidx", "ridx", "params"], ["partial"], WGRAD_DIRECT_SOURCE),
    "wgrad_mma": (["x", "ct", "gidx", "ridx", "chunks", "params"], ["partial"], WGRAD_MMA_SOURCE),
    "wgrad_reduce": (["partial", "first", "params"], ["dw"], WGRAD_REDUCE_SOURCE),
    "grouped_fetch_on_demand": (
        ["x", "w", "offsets", "gather", "kidx", "params"], ["y"], GROUPED_FETCH_ON_DEMAND_SOURCE,
    ),
    "grouped_wgrad": (["x", "ct", "chunks", "gidx", "ridx", "params"], ["partial"], GROUPED_WGRAD_SOURCE),
}, header=HEADER)
