"""CUDA routes (MLX on NVIDIA GPUs), written as ``mx.fast.cuda_kernel``
sources that MLX compiles at run time: no private MLX C++ ABI is needed.

Every route computes the same product as the C++ primitives,
``y[r] = sum over the edges of row r of x[g] @ W[k]`` over a CSR view of a
relation, and gets its autodiff from ``mx.custom_function``: the input
gradient is the same product over the relation with roles swapped and W
transposed, the weight gradient a per-offset contraction. Each derived
product asks the route registry again and is recorded in diagnostics.
"""

from __future__ import annotations

import functools

import numpy as np
import mlx.core as mx

from . import diagnostics

# ------------------------------------------------------------------ sources
HEADER = """
#include <mma.h>
"""

# Fetch-on-demand: one thread per (row, output channel) over the CSR edges.
FOD_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const int rows = params[0];
  if (idx >= (long)rows * B) return;
  const int r = (int)(idx / B);
  const int c = (int)(idx % B);
  const int e0 = IDENTITY ? r : offsets[r];
  const int e1 = IDENTITY ? r + 1 : offsets[r + 1];
  float acc = 0.0f;
  for (int e = e0; e < e1; ++e) {
    const long g = IDENTITY ? r : gather[e];
    const long k = IDENTITY ? 0 : kidx[e];
    const T* xr = x + g * A;
    const T* wk = w + k * A * B + c;
    for (int a = 0; a < A; ++a) {
      acc += static_cast<float>(xr[a]) * static_cast<float>(wk[(long)a * B]);
    }
  }
  y[(long)r * B + c] = static_cast<T>(acc);
"""

# Sorted implicit GEMM on tensor cores: 64 rows (in neighbour-mask order) per
# block, four warps of 16 rows each holding B/16 accumulator fragments for
# the whole tile. For each offset present in the tile's mask, the 64 gathered
# input rows and W[k] are staged in shared memory with 16-byte loads, then
# contracted over all A input channels. Dynamic shared memory: the staged
# operands during the loop, the float output tile after it.
SORTED_MMA_SOURCE = """
  using namespace nvcuda;
  constexpr int TM = 64;
  constexpr int LDX = A + 8;
  constexpr int LDW = B + 8;
  constexpr int LDO = B + 4;
  constexpr int VA = A / 8;
  constexpr int VB = B / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  T* xs = reinterpret_cast<T*>(smem);
  T* ws = xs + TM * LDX;
  float* os = reinterpret_cast<float*>(smem);
  const int rows = params[0];
  const int tile = blockIdx.x;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const unsigned long long mask = tile_masks[tile];
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[B / 16];
  for (int j = 0; j < B / 16; ++j) wmma::fill_fragment(acc[j], 0.0f);
  for (int k = 0; k < K; ++k) {
    if (((mask >> k) & 1ull) == 0) continue;
    __syncthreads();
    for (int i = tid; i < TM * VA; i += 128) {
      const int rr = i / VA, v = i % VA;
      const int row = tile * TM + rr;
      const int in = row < rows ? sorted_map[(long)row * K + k] : -1;
      uint4 val = make_uint4(0u, 0u, 0u, 0u);
      if (in >= 0) val = reinterpret_cast<const uint4*>(x + (long)in * A)[v];
      *reinterpret_cast<uint4*>(xs + rr * LDX + v * 8) = val;
    }
    for (int i = tid; i < A * VB; i += 128) {
      const int ar = i / VB, v = i % VB;
      *reinterpret_cast<uint4*>(ws + ar * LDW + v * 8) =
          reinterpret_cast<const uint4*>(w + ((long)k * A + ar) * B)[v];
    }
    __syncthreads();
    for (int a0 = 0; a0 < A; a0 += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
      wmma::load_matrix_sync(fa, xs + warp * 16 * LDX + a0, LDX);
      for (int j = 0; j < B / 16; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
        wmma::load_matrix_sync(fb, ws + a0 * LDW + j * 16, LDW);
        wmma::mma_sync(acc[j], fa, fb, acc[j]);
      }
    }
  }
  __syncthreads();
  for (int j = 0; j < B / 16; ++j) {
    wmma::store_matrix_sync(os + warp * 16 * LDO + j * 16, acc[j], LDO, wmma::mem_row_major);
  }
  __syncthreads();
  for (int i = tid; i < TM * B; i += 128) {
    const int row = tile * TM + i / B;
    if (row < rows) {
      y[(long)reorder[row] * B + i % B] = static_cast<T>(os[(i / B) * LDO + i % B]);
    }
  }
"""


def sorted_mma_shared_bytes(a: int, b: int) -> int:
    staged = 64 * (a + 8) * 2 + a * (b + 8) * 2
    return max(staged, 64 * (b + 4) * 4)


# Weight gradient, direct: one thread per (offset, a, b) over kernel-major edges.
WGRAD_DIRECT_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (long)K * A * B) return;
  const int k = (int)(idx / ((long)A * B));
  const int a = (int)((idx / B) % A);
  const int b = (int)(idx % B);
  const int e0 = IDENTITY ? 0 : koffsets[k];
  const int e1 = IDENTITY ? params[0] : koffsets[k + 1];
  float acc = 0.0f;
  for (int e = e0; e < e1; ++e) {
    const long g = IDENTITY ? e : gidx[e];
    const long r = IDENTITY ? e : ridx[e];
    acc += static_cast<float>(x[g * A + a]) * static_cast<float>(ct[r * B + b]);
  }
  dw[idx] = static_cast<T>(acc);
"""

# Weight gradient on tensor cores: one block per chunk of up to 256 edges of
# one offset; gathered rows of x and ct go through shared memory 32 edges at
# a time (16-byte loads), dW_chunk = X^T G accumulates in fragments spread
# over four warps. Partial sums are reduced per offset, in chunk order, by
# WGRAD_REDUCE.
WGRAD_MMA_SOURCE = """
  using namespace nvcuda;
  constexpr int SE = 32;
  constexpr int LDX = A + 8;
  constexpr int LDG = B + 8;
  constexpr int VA = A / 8;
  constexpr int VB = B / 8;
  constexpr int TILES = (A / 16) * (B / 16);
  constexpr int PER_WARP = (TILES + 3) / 4;
  __shared__ __align__(32) T xs[SE * LDX];
  __shared__ __align__(32) T gs[SE * LDG];
  const int chunk = blockIdx.x;
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
      if (e < e1) val = reinterpret_cast<const uint4*>(x + (long)gidx[e] * A)[v];
      *reinterpret_cast<uint4*>(xs + (i / VA) * LDX + v * 8) = val;
    }
    for (int i = tid; i < SE * VB; i += 128) {
      const int e = s + i / VB, v = i % VB;
      uint4 val = make_uint4(0u, 0u, 0u, 0u);
      if (e < e1) val = reinterpret_cast<const uint4*>(ct + (long)ridx[e] * B)[v];
      *reinterpret_cast<uint4*>(gs + (i / VB) * LDG + v * 8) = val;
    }
    __syncthreads();
    for (int kk = 0; kk < SE; kk += 16) {
      for (int t = 0; t < PER_WARP; ++t) {
        const int tile = warp * PER_WARP + t;
        if (tile >= TILES) break;
        const int ta = tile / (B / 16), tb = tile % (B / 16);
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, xs + kk * LDX + ta * 16, LDX);
        wmma::load_matrix_sync(fb, gs + kk * LDG + tb * 16, LDG);
        wmma::mma_sync(acc[t], fa, fb, acc[t]);
      }
    }
  }
  float* out = partial + (long)chunk * A * B;
  for (int t = 0; t < PER_WARP; ++t) {
    const int tile = warp * PER_WARP + t;
    if (tile >= TILES) break;
    const int ta = tile / (B / 16), tb = tile % (B / 16);
    wmma::store_matrix_sync(out + ta * 16 * B + tb * 16, acc[t], B, wmma::mem_row_major);
  }
"""

WGRAD_REDUCE_SOURCE = """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (long)K * A * B) return;
  const int k = (int)(idx / ((long)A * B));
  const long ab = idx % ((long)A * B);
  float acc = 0.0f;
  for (int c = first[k]; c < first[k + 1]; ++c) acc += partial[(long)c * A * B + ab];
  dw[idx] = static_cast<T>(acc);
"""


@functools.lru_cache(maxsize=None)
def _kernel(name: str, shared_memory: int = 0):
    spec = {
        "fod": (["x", "w", "offsets", "gather", "kidx", "params"], ["y"], FOD_SOURCE),
        "sorted_mma": (["x", "w", "reorder", "sorted_map", "tile_masks", "params"], ["y"], SORTED_MMA_SOURCE),
        "wgrad_direct": (["x", "ct", "koffsets", "gidx", "ridx", "params"], ["dw"], WGRAD_DIRECT_SOURCE),
        "wgrad_mma": (["x", "ct", "gidx", "ridx", "chunks"], ["partial"], WGRAD_MMA_SOURCE),
        "wgrad_reduce": (["partial", "first"], ["dw"], WGRAD_REDUCE_SOURCE),
    }[name]
    return mx.fast.cuda_kernel(
        name=f"mlx_lattice_{name}", input_names=spec[0], output_names=spec[1], source=spec[2],
        header=HEADER, shared_memory=shared_memory,
    )


def available() -> bool:
    cuda = getattr(mx, "cuda", None)
    return cuda is not None and cuda.is_available()


# ------------------------------------------------------------------ views
class View:
    """A CSR view of a relation for CUDA products: rows, gathered rows and the
    sorted plan, plus the view with roles exchanged (for input gradients)."""

    def __init__(self, relation, flipped=None):
        self.rel = relation  # mlx_lattice.relation.Relation (may be a swapped one)
        self._flipped = flipped
        self._chunks = None

    @property
    def rows(self) -> int:
        return self.rel.n_out

    def flipped(self) -> "View":
        if self._flipped is None:
            swapped = self.rel.swapped(self.rel.kind, self.rel.geometry)
            self._flipped = View(swapped, flipped=self)
            swapped._cuda_view = self._flipped
        return self._flipped

    def csr(self):
        return self.rel.out_offsets, self.rel.in_idx, self.rel.k_idx

    def plan(self):
        return self.rel.sorted_plan()

    def wgrad_chunks(self, size=256):
        """(n_chunks, 3) [k, e0, e1] over the kernel-major edges, and first chunk per k."""
        if self._chunks is None:
            km = self.rel.kernel_major()
            off = np.array(km.offsets)
            rows, first = [], [0]
            for k in range(len(off) - 1):
                for e in range(int(off[k]), int(off[k + 1]), size):
                    rows.append((k, e, min(e + size, int(off[k + 1]))))
                first.append(len(rows))
            chunks = np.array(rows, dtype=np.int32).reshape(-1, 3)
            self._chunks = (mx.array(chunks), mx.array(np.array(first, dtype=np.int32)), km)
        return self._chunks


def view_of(relation) -> View:
    """The relation's CUDA view, kept on the relation so that the swapped
    relation and sorted plans are built once per relation, not per call."""
    v = getattr(relation, "_cuda_view", None)
    if v is None:
        v = View(relation)
        relation._cuda_view = v
    return v


# ------------------------------------------------------------------ kernels
def _params(*vals):
    return mx.array(np.array(vals, dtype=np.int32))


def _fod(x, w, view: View | None):
    k, a, b = w.shape
    rows = x.shape[0] if view is None else view.rows
    if view is None:
        offsets = gather = kidx = mx.zeros((1,), mx.int32)
    else:
        offsets, gather, kidx = view.csr()
    return _kernel("fod")(
        inputs=[x, w, offsets, gather, kidx, _params(rows)],
        template=[("T", x.dtype), ("A", a), ("B", b), ("IDENTITY", view is None)],
        grid=(max(rows * b, 1), 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(rows, b)], output_dtypes=[x.dtype],
    )[0]


def _sorted_mma(x, w, view: View):
    k, a, b = w.shape
    plan = view.plan()
    rows = view.rows
    tiles = -(-rows // 64)
    return _kernel("sorted_mma", sorted_mma_shared_bytes(a, b))(
        inputs=[x, w, plan.reorder_rows, plan.sorted_out_in_map, plan.tile_masks, _params(rows)],
        template=[("T", x.dtype), ("A", a), ("B", b), ("K", k)],
        grid=(max(tiles, 1) * 128, 1, 1), threadgroup=(128, 1, 1),
        output_shapes=[(rows, b)], output_dtypes=[x.dtype],
    )[0]


def _wgrad_direct(x, ct, view: View | None, k):
    a, b = x.shape[1], ct.shape[1]
    if view is None:
        ko = gi = ri = mx.zeros((1,), mx.int32)
        n = x.shape[0]
    else:
        km = view.rel.kernel_major()
        ko, gi, ri = km.offsets, km.in_idx, km.out_idx
        n = 0
    return _kernel("wgrad_direct")(
        inputs=[x, ct, ko, gi, ri, _params(n)],
        template=[("T", x.dtype), ("A", a), ("B", b), ("K", k), ("IDENTITY", view is None)],
        grid=(max(k * a * b, 1), 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(k, a, b)], output_dtypes=[x.dtype],
    )[0]


def _wgrad_mma(x, ct, view: View, k):
    a, b = x.shape[1], ct.shape[1]
    chunks, first, km = view.wgrad_chunks()
    n_chunks = chunks.shape[0]
    if n_chunks == 0:
        return mx.zeros((k, a, b), dtype=x.dtype)
    partial = _kernel("wgrad_mma")(
        inputs=[x, ct, km.in_idx, km.out_idx, chunks],
        template=[("T", x.dtype), ("A", a), ("B", b)],
        grid=(n_chunks * 128, 1, 1), threadgroup=(128, 1, 1),
        output_shapes=[(n_chunks, a, b)], output_dtypes=[mx.float32],
    )[0]
    return _kernel("wgrad_reduce")(
        inputs=[partial, first],
        template=[("T", x.dtype), ("A", a), ("B", b), ("K", k)],
        grid=(k * a * b, 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(k, a, b)], output_dtypes=[x.dtype],
    )[0]


PRODUCTS = {
    "cuda.pointwise": lambda x, w, view: mx.matmul(x, w[0]),
    "cuda.fetch_on_demand": _fod,
    "cuda.sorted_mma": _sorted_mma,
}
WEIGHT_GRADIENTS = {"cuda.wgrad_direct": _wgrad_direct, "cuda.wgrad_mma": _wgrad_mma}


# ------------------------------------------------------------------ autodiff
def _route(direction, view: View | None, k, a, b, rows_in, dtype, from_route):
    from . import routes

    ctx = routes.RouteContext(
        op=f"{direction} of {from_route}",
        map_kind="forward" if view is None else view.rel.kind,
        dtype=str(dtype).replace("mlx.core.", ""),
        backend="cuda",
        kernel_size=(1, 1, 1) if view is None else None,
        k=k, c_in=a, c_out=b, n_in=rows_in,
        n_out=rows_in if view is None else view.rows,
        edges=rows_in if view is None else view.rel.edges,
        direction=direction, weight_layout="mapped", tier="cuda",
    )
    sel = routes.select(ctx)
    entry = ctx.as_dict()
    entry.update(route=sel.route.name, backend=sel.route.backend, rejected=sel.rejected,
                 fallback=sel.fallback, deterministic=sel.route.deterministic)
    diagnostics.emit(entry)
    return sel.route.name


def conv(route: str, x: mx.array, w: mx.array, view: View | None) -> mx.array:
    """y = sum over edges of x[g] @ w[k] on `view` (None: pointwise), with VJP/JVP."""

    @mx.custom_function
    def f(x, w):
        # stop_gradient keeps forward-mode tracing out of the kernel itself
        # (its JVP is f_jvp below); reverse mode goes through f_vjp anyway.
        return PRODUCTS[route](mx.stop_gradient(x), mx.stop_gradient(w), view)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        x, w = primals
        k, a, b = w.shape
        back = None if view is None else view.flipped()
        r_d = _route("dgrad", back, k, b, a, cotangent.shape[0], x.dtype, route)
        dx = conv(r_d, cotangent, mx.swapaxes(w, 1, 2), back)
        r_w = _route("wgrad", view, k, a, b, x.shape[0], x.dtype, route)
        dw = weight_grad(r_w, x, cotangent, view, k)
        return dx, dw

    @f.jvp
    def f_jvp(primals, tangents):
        x, w = primals
        tx, tw = tangents
        terms = []
        if tx is not None:
            terms.append(conv(route, tx, w, view))
        if tw is not None:
            terms.append(conv(route, x, tw, view))
        return sum(terms[1:], terms[0]) if terms else mx.zeros((x.shape[0] if view is None else view.rows, w.shape[2]), x.dtype)

    return f(x, w)


def weight_grad(route: str, x: mx.array, ct: mx.array, view: View | None, k: int) -> mx.array:
    """dW[k] = sum over the edges of offset k of x[g]^T ct[r], with VJP/JVP."""

    @mx.custom_function
    def f(x, ct):
        x, ct = mx.stop_gradient(x), mx.stop_gradient(ct)
        if route == "cuda.wgrad_mma" and view is not None:
            return _wgrad_mma(x, ct, view, k)
        return _wgrad_direct(x, ct, view, k)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        x, ct = primals
        back = None if view is None else view.flipped()
        a, b = x.shape[1], ct.shape[1]
        r_x = _route("dgrad", back, k, b, a, ct.shape[0], x.dtype, route)
        gx = conv(r_x, ct, mx.swapaxes(cotangent, 1, 2), back)
        r_c = _route("forward", view, k, a, b, x.shape[0], x.dtype, route)
        gct = conv(r_c, x, cotangent, view)
        return gx, gct

    @f.jvp
    def f_jvp(primals, tangents):
        x, ct = primals
        tx, tct = tangents
        terms = []
        if tx is not None:
            terms.append(weight_grad(route, tx, ct, view, k))
        if tct is not None:
            terms.append(weight_grad(route, x, tct, view, k))
        return sum(terms[1:], terms[0]) if terms else mx.zeros((k, x.shape[1], ct.shape[1]), x.dtype)

    return f(x, ct)
