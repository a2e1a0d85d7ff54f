"""Batch / instance normalisation + activation (+ residual) on CUDA: the
contract of the CPU primitive ``_ext.norm_act`` as ``mx.fast.cuda_kernel``
launches, with a closed-form backward pass.

``act(w * (x - mean_s) / sqrt(var_s + eps) + b + residual)`` per segment s
(one segment for batch norm; one per batch item for instance norm, given
each row's segment id, rows in any order), with the training statistics
(float32 mean and biased variance, also returned) or given ones (eval).
Features float32 / float16 / bfloat16; statistics computed in float32 (and
returned so); weight, bias and given statistics read in their own dtype and
widened; the residual is added before the one rounding to the features'
dtype.

Kernels (R = 64-row chunks, fixed, so every sum has a fixed order and the
results repeat bit for bit; no atomics):

- forward, training: ``norm_stats`` (one thread per chunk and channel: the
  count, the sum of x - x0 with x0 the segment's first row in the chunk, and
  the sum of squares about the chunk's mean, per segment) -> ``norm_merge``
  (one block per channel: the chunks merged in float64 with the pairwise
  update of Chan, Golub and LeVeque, each thread over a fixed stride of
  chunks and then a fixed tree; exact where mean^2 >> var; for a batch norm
  layer in training also its new running statistics, ``norm_act_running``)
  -> ``norm_apply`` (one thread per element). Eval: ``norm_apply`` alone.
- backward: ``norm_grad_stats`` (per chunk and channel: sum of g and of
  g * xhat, g = ct * act'(z)) -> ``norm_grad_merge`` (per channel: the sums,
  dweight, dbias and the coefficients of dx = k0 g + k1 (x - mean) + k2) ->
  ``norm_grad_apply`` (dx and the residual's gradient g, per element).

act'(z) comes from the sign of z recomputed from x with the forward pass's
own expression, or from y's sign when a residual was added (the residual is
not an input of the backward pass), as on the CPU. The graph of one norm is
three kernel primitives forward (one in eval) and three backward, plus the
custom function's node and stop-gradients of its inputs (they keep
forward-mode tracing out of the kernels). The derivatives besides the
backward kernels (given statistics, forward mode) are ``autodiff``'s, the
rules of every backend's norm. ``norm_act`` keeps the contract of
``_ext.norm_act`` (differentiable statistics outputs, for which reverse mode
makes zero cotangents when nothing reads them); the layers call
``norm_act_layer``, whose statistics come without gradient from outside the
custom function (they only feed the running statistics), so its one output
needs none. In a MinkUNet step that is about 50 primitives fewer per norm
than the MLX-op path (forward and backward; docs/benchmarks.md).
"""

from __future__ import annotations

import functools

import numpy as np
import mlx.core as mx

from ... import autodiff
from . import jit

# Rows per reduction chunk; threads per merge block.
CHUNK_ROWS = 64
MERGE_THREADS = 256

HEADER = """
// z = x * scale + shift (+ r): explicit roundings, so the forward pass and
// the backward pass's recomputation of z's sign agree bit for bit.
__device__ __forceinline__ float lattice_inv_std(float var, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, eps)));
}
__device__ __forceinline__ void lattice_scale_shift(
    float w, float b, float mean, float inv, float& scale, float& shift) {
  scale = __fmul_rn(w, inv);
  shift = __fmaf_rn(-mean, scale, b);
}
// A chunk's float32 mean from its shift x0 and the sum of x - x0.
__device__ __forceinline__ float lattice_chunk_mean(float x0, float sum, float count) {
  return count > 0.0f ? __fadd_rn(x0, __fdiv_rn(sum, count)) : 0.0f;
}
// Row and channel of element idx of an (n, C) array (32-bit division
// where the index fits).
__device__ __forceinline__ void lattice_row_col(long idx, int C, long& i, int& c) {
  if (idx <= 0xffffffffL) {
    const unsigned u = (unsigned)idx, q = u / (unsigned)C;
    i = q;
    c = (int)(u - q * (unsigned)C);
  } else {
    i = idx / C;
    c = (int)(idx % C);
  }
}
// Pairwise update of (count, mean, M2) in float64.
__device__ __forceinline__ void lattice_chan(
    double& na, double& ma, double& qa, double nb, double mb, double qb) {
  if (nb == 0.0) return;
  const double n = na + nb;
  const double delta = mb - ma;
  ma += delta * (nb / n);
  qa += qb + delta * delta * (na * nb / n);
  na = n;
}
"""

# Runs of equal segment ids in a chunk [i0, i1): the body sees s, a, b.
_RUNS = """
#pragma unroll 1
  for (long a = i0; a < i1;) {
    const int s = SEGMENTED ? seg[a] : 0;
    long b = i1;
    if (SEGMENTED) {
      b = a + 1;
      while (b < i1 && seg[b] == s) ++b;
    }
    BODY
    a = b;
  }
"""

# Run-time parameters (one compiled kernel per dtype): the sizes from the
# shapes MLX passes by value (x_shape, part_shape), and small constant arrays
# made once per setting (segments, flags; eps and the activation's slope
# below 0), so a call uploads nothing from the host.
_FLAGS = """
  [[maybe_unused]] const int S = params[0];
  [[maybe_unused]] const bool SEGMENTED = params[1] != 0, RESIDUAL = params[2] != 0,
      TRAINING = params[3] != 0, STAT_CT = params[4] != 0, RUNNING = params[5] != 0;
  [[maybe_unused]] const float eps = fparams[0], low = fparams[1];
"""
_ROWS = _FLAGS + """
  [[maybe_unused]] const int n = x_shape[0], C = x_shape[1];
  [[maybe_unused]] const int P = (n + R - 1) / R;
"""
_PARTS = _FLAGS + """
  const int P = part_shape[1], C = part_shape[3];
"""

_CHUNK_THREAD = _ROWS + """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (long)P * C) return;
  const int k = (int)(idx / C);
  const int c = (int)(idx % C);
  const long plane = (long)P * S * C;
  const long i0 = (long)k * R;
  const long i1 = min((long)n, i0 + R);
  float* slot = part + (long)k * S * C + c;  // segment s at slot[s * C + q * plane]
"""

# Per chunk and segment: sum of x - x0, sum of squares about the chunk's
# float32 mean, x0, row count (planes 0-3 of part).
STATS_SOURCE = _CHUNK_THREAD + """
#pragma unroll 1
  for (int s = 0; s < S; ++s) {
    for (int q = 0; q < 4; ++q) slot[s * C + q * plane] = 0.0f;
  }
""" + _RUNS.replace("BODY", """
    float* p = slot + s * C;
    float x0;
    if (p[3 * plane] == 0.0f) {
      x0 = static_cast<float>(x[a * C + c]);
      p[2 * plane] = x0;
    } else {
      x0 = p[2 * plane];
    }
    float acc = 0.0f;
#pragma unroll 4
    for (long i = a; i < b; ++i) acc = __fadd_rn(acc, __fsub_rn(static_cast<float>(x[i * C + c]), x0));
    p[0] = __fadd_rn(p[0], acc);
    p[3 * plane] = __fadd_rn(p[3 * plane], (float)(b - a));
""") + _RUNS.replace("BODY", """
    float* p = slot + s * C;
    const float mu = lattice_chunk_mean(p[2 * plane], p[0], p[3 * plane]);
    float acc = 0.0f;
#pragma unroll 4
    for (long i = a; i < b; ++i) {
      const float d = __fsub_rn(static_cast<float>(x[i * C + c]), mu);
      acc = __fmaf_rn(d, d, acc);
    }
    p[plane] = __fadd_rn(p[plane], acc);
""")

# One block per channel; segments in turn. Thread t merges chunks t, t + NT,
# ... in order, then the threads merge in a fixed tree.
MERGE_SOURCE = _PARTS + """
  constexpr int NT = MERGE_THREADS;
  __shared__ double sn[NT], sm[NT], sq[NT];
  const int c = blockIdx.x;
  const int t = threadIdx.x;
  const long plane = (long)P * S * C;
  for (int s = 0; s < S; ++s) {
    double na = 0.0, ma = 0.0, qa = 0.0;
#pragma unroll 1
    for (int k = t; k < P; k += NT) {
      const long j = ((long)k * S + s) * C + c;
      const float cnt = part[3 * plane + j];
      if (cnt == 0.0f) continue;
      const float x0 = part[2 * plane + j], sum = part[j];
      const double nb = cnt;
      const double mb = (double)x0 + (double)sum / nb;
      // squares about mb rather than the float32 centre of the chunk's sweep
      const double off = mb - (double)lattice_chunk_mean(x0, sum, cnt);
      lattice_chan(na, ma, qa, nb, mb, (double)part[plane + j] - nb * off * off);
    }
    sn[t] = na; sm[t] = ma; sq[t] = qa;
    __syncthreads();
#pragma unroll 1
    for (int h = NT / 2; h > 0; h >>= 1) {
      if (t < h) {
        double a0 = sn[t], a1 = sm[t], a2 = sq[t];
        lattice_chan(a0, a1, a2, sn[t + h], sm[t + h], sq[t + h]);
        sn[t] = a0; sm[t] = a1; sq[t] = a2;
      }
      __syncthreads();
    }
    if (t == 0) {
      const float m = sn[0] > 0.0 ? (float)sm[0] : 0.0f;
      const float v = sn[0] > 0.0 ? (float)(fmax(sq[0], 0.0) / sn[0]) : 0.0f;
      mean[s * C + c] = m;
      var[s * C + c] = v;
      if (RUNNING) {
        // the running statistics (one segment), as RUNNING_SOURCE forms them
        const float keep = rcoef[0], mu = rcoef[1], ratio = rcoef[2];
        new_mean[c] = __fadd_rn(__fmul_rn(keep, rmean[c]), __fmul_rn(mu, m));
        new_var[c] = __fadd_rn(__fmul_rn(keep, rvar[c]), __fmul_rn(mu, __fmul_rn(v, ratio)));
      }
    }
    __syncthreads();
  }
"""

APPLY_SOURCE = _ROWS + """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (long)n * C) return;
  long i;
  int c;
  lattice_row_col(idx, C, i, c);
  const int j = (SEGMENTED ? seg[i] : 0) * C + c;
  float scale, shift;
  lattice_scale_shift(static_cast<float>(w[c]), static_cast<float>(b[c]), static_cast<float>(mean[j]),
                      lattice_inv_std(static_cast<float>(var[j]), eps), scale, shift);
  float z = __fmaf_rn(static_cast<float>(x[idx]), scale, shift);
  if (RESIDUAL) z = __fadd_rn(z, static_cast<float>(r[idx]));
  y[idx] = static_cast<T>(z > 0.0f ? z : __fmul_rn(low, z));
"""

# g = ct * act'(z): z from x (no residual) or its sign from y.
_GATE = """
      const float ctv = static_cast<float>(ct[i * C + c]);
      const float xv = static_cast<float>(x[i * C + c]);
      const float z = RESIDUAL ? static_cast<float>(y[i * C + c]) : __fmaf_rn(xv, scale, shift);
      const float g = z > 0.0f ? ctv : __fmul_rn(low, ctv);
"""

# Per chunk and segment: sum of g, sum of g * xhat, row count (planes 0-2).
GRAD_STATS_SOURCE = _CHUNK_THREAD + """
#pragma unroll 1
  for (int s = 0; s < S; ++s) {
    for (int q = 0; q < 3; ++q) slot[s * C + q * plane] = 0.0f;
  }
""" + _RUNS.replace("BODY", """
    const int j = s * C + c;
    const float mu = static_cast<float>(mean[j]);
    const float inv = lattice_inv_std(static_cast<float>(var[j]), eps);
    float scale, shift;
    lattice_scale_shift(static_cast<float>(w[c]), static_cast<float>(bias[c]), mu, inv, scale, shift);
    float sa = 0.0f, sb = 0.0f;
#pragma unroll 4
    for (long i = a; i < b; ++i) {""" + _GATE + """
      sa = __fadd_rn(sa, g);
      sb = __fmaf_rn(g, __fmul_rn(__fsub_rn(xv, mu), inv), sb);
    }
    float* p = slot + s * C;
    p[0] = __fadd_rn(p[0], sa);
    p[plane] = __fadd_rn(p[plane], sb);
    p[2 * plane] = __fadd_rn(p[2 * plane], (float)(b - a));
""")

# One block per channel: per segment the sums over chunks (float64, a fixed
# stride then a fixed tree), dx's coefficients; dweight and dbias summed over
# the segments in order. Training: dx = w inv (g - A/n - xhat B/n) +
# ct_mean/n + 2 ct_var (x - mean)/n = k0 g + k1 (x - mean) + k2; eval:
# dx = k0 g.
GRAD_MERGE_SOURCE = _PARTS + """
  constexpr int NT = MERGE_THREADS;
  __shared__ double sa[NT], sb[NT], sn[NT];
  const int c = blockIdx.x;
  const int t = threadIdx.x;
  const long plane = (long)P * S * C;
  double dw_acc = 0.0, db_acc = 0.0;
  for (int s = 0; s < S; ++s) {
    double a0 = 0.0, b0 = 0.0, n0 = 0.0;
#pragma unroll 1
    for (int k = t; k < P; k += NT) {
      const long j = ((long)k * S + s) * C + c;
      a0 += part[j];
      b0 += part[plane + j];
      n0 += part[2 * plane + j];
    }
    sa[t] = a0; sb[t] = b0; sn[t] = n0;
    __syncthreads();
#pragma unroll 1
    for (int h = NT / 2; h > 0; h >>= 1) {
      if (t < h) {
        sa[t] += sa[t + h];
        sb[t] += sb[t + h];
        sn[t] += sn[t + h];
      }
      __syncthreads();
    }
    if (t == 0) {
      const int j = s * C + c;
      const float wc = static_cast<float>(w[c]);
      const float inv = lattice_inv_std(static_cast<float>(var[j]), eps);
      coef[j] = __fmul_rn(wc, inv);
      if (TRAINING) {
        const double rn = sn[0] > 0.0 ? 1.0 / sn[0] : 0.0;
        const double wi = (double)wc * inv;
        // STAT_CT: the statistics were outputs with cotangents of their own
        const double cv = STAT_CT ? 2.0 * ct_var[j] * rn : 0.0, cm = STAT_CT ? ct_mean[j] * rn : 0.0;
        coef[S * C + j] = (float)(cv - wi * inv * sb[0] * rn);
        coef[2 * S * C + j] = (float)(cm - wi * sa[0] * rn);
      } else {
        coef[S * C + j] = 0.0f;
        coef[2 * S * C + j] = 0.0f;
      }
      dw_acc += sb[0];
      db_acc += sa[0];
    }
    __syncthreads();
  }
  if (t == 0) {
    dw[c] = static_cast<W>((float)dw_acc);
    db[c] = static_cast<W>((float)db_acc);
  }
"""

GRAD_APPLY_SOURCE = _ROWS + """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (long)n * C) return;
  long i;
  int c;
  lattice_row_col(idx, C, i, c);
  const int j = (SEGMENTED ? seg[i] : 0) * C + c;
  const float mu = static_cast<float>(mean[j]);
  float scale, shift;
  lattice_scale_shift(static_cast<float>(w[c]), static_cast<float>(bias[c]), mu,
                      lattice_inv_std(static_cast<float>(var[j]), eps), scale, shift);
""" + _GATE + """
  if (RESIDUAL) dr[i * C + c] = static_cast<T>(g);
  float d;
  if (TRAINING) {
    d = __fmaf_rn(coef[j], g, __fmaf_rn(coef[S * C + j], __fsub_rn(xv, mu), coef[2 * S * C + j]));
  } else {
    d = __fmul_rn(coef[j], g);
  }
  dx[i * C + c] = static_cast<T>(d);
"""

# Running statistics after a training call, one thread per channel, in the
# CPU primitive's order and roundings (_ext.running_stats: MLX's float32
# ops, no contraction): keep * mean + mu * batch_mean and keep * var +
# mu * (batch_var * ratio). One primitive where the MLX-op form puts about
# fifteen (two gathers, four products, two sums and their broadcasts) into
# a training step's graph per norm.
RUNNING_SOURCE = """
  const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= params[0]) return;
  const float keep = coef[0], mu = coef[1], ratio = coef[2];
  new_mean[c] = __fadd_rn(__fmul_rn(keep, mean[c]), __fmul_rn(mu, batch_mean[c]));
  new_var[c] = __fadd_rn(__fmul_rn(keep, var[c]), __fmul_rn(mu, __fmul_rn(batch_var[c], ratio)));
"""

_SPECS = {
    "running_stats": (["mean", "var", "batch_mean", "batch_var", "params", "coef"], ["new_mean", "new_var"],
                      RUNNING_SOURCE),
    "norm_stats": (["x", "seg", "params", "fparams"], ["part"], STATS_SOURCE),
    "norm_merge": (["part", "params", "fparams", "rmean", "rvar", "rcoef"], ["mean", "var", "new_mean", "new_var"],
                   MERGE_SOURCE),
    "norm_apply": (["x", "w", "b", "mean", "var", "r", "seg", "params", "fparams"], ["y"], APPLY_SOURCE),
    "norm_grad_stats": (
        ["x", "y", "ct", "w", "bias", "mean", "var", "seg", "params", "fparams"], ["part"], GRAD_STATS_SOURCE,
    ),
    "norm_grad_merge": (
        ["part", "w", "var", "ct_mean", "ct_var", "params", "fparams"], ["coef", "dw", "db"], GRAD_MERGE_SOURCE,
    ),
    "norm_grad_apply": (
        ["x", "y", "ct", "w", "bias", "mean", "var", "coef", "seg", "params", "fparams"], ["dx", "dr"],
        GRAD_APPLY_SOURCE,
    ),
}


_kernel = jit.Family("mlx_lattice_", _SPECS, header=HEADER)


@functools.lru_cache(maxsize=None)
def _constant(values: tuple, dtype) -> mx.array:
    """A small array made once: a leaf (no primitive) that later calls
    reuse where it already lies, rather than uploading it again."""
    return mx.array(np.array(values, dtype))


def _placeholder(dtype=np.float32) -> mx.array:
    """For an input the kernel does not read."""
    return _constant((0,), dtype)


class _Spec:
    """What one norm call computes (fixed for its forward and backward)."""

    def __init__(self, n, c, segments, n_segments, training, residual, eps, low, stat_ct=True):
        self.n, self.c = n, c
        self.segments = segments  # int32 (N,) or None
        self.s = n_segments
        self.training, self.residual = training, residual
        # training: the statistics are outputs of the custom function with
        # cotangents of their own (the _ext.norm_act contract), or inputs
        # made outside it without gradient (norm_act_layer)
        self.stat_ct = training and stat_ct
        self.eps, self.low = eps, low
        self.chunks = max(1, -(-n // CHUNK_ROWS))
        # a spec without segments is kept with its custom function (one per
        # norm of a network): what its launches pass is made once
        self._params = {}

    def template(self, **dtypes):
        """Compile-time arguments: the dtypes a kernel reads or writes (T the
        features', W the weight's and bias's, M the statistics') and the
        fixed sizes."""
        return _template(tuple(dtypes.items()))

    def params(self, running: bool = False) -> list[mx.array]:
        hit = self._params.get(running)
        if hit is None:
            ints = (self.s, self.segments is not None, self.residual, self.training, self.stat_ct, running)
            hit = self._params[running] = [_constant(ints, np.int32), _constant((self.eps, self.low), np.float32)]
        return hit

    def seg(self) -> mx.array:
        return self.segments if self.segments is not None else _placeholder(np.int32)


@functools.lru_cache(maxsize=64)
def _template(dtypes: tuple) -> tuple:
    return dtypes + (("R", CHUNK_ROWS), ("MERGE_THREADS", MERGE_THREADS))


def _statistics(spec: _Spec, x, running=None):
    """(mean, biased variance), float32 (S, C), of x's rows per segment;
    ``running`` (one segment): (running mean, running var, keep, mu, ratio),
    float32 (C,) statistics updated in the same kernel as ``running_stats``
    would, then returned too: (mean, var, new mean, new var)."""
    p = spec.chunks
    (part,) = _kernel("norm_stats")(
        inputs=[x, spec.seg(), *spec.params()], template=spec.template(T=x.dtype),
        grid=(p * spec.c, 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(4, p, spec.s, spec.c)], output_dtypes=[mx.float32],
    )
    if running is None:
        rm = rv = rc = _placeholder()
        size = 1
    else:
        rm, rv = running[:2]
        rc, size = _coefficients(*(float(v) for v in running[2:])), spec.c
    mean, var, new_mean, new_var = _kernel("norm_merge")(
        inputs=[part, *spec.params(running is not None), rm, rv, rc], template=spec.template(),
        grid=(spec.c * MERGE_THREADS, 1, 1), threadgroup=(MERGE_THREADS, 1, 1),
        output_shapes=[(spec.s, spec.c), (spec.s, spec.c), (size,), (size,)], output_dtypes=[mx.float32] * 4,
    )
    return (mean, var) if running is None else (mean, var, new_mean, new_var)


def _apply(spec: _Spec, x, w, b, mean, var, r):
    return _kernel("norm_apply")(
        inputs=[x, w, b, mean, var, r if r is not None else _placeholder(), spec.seg(), *spec.params()],
        template=spec.template(T=x.dtype, W=w.dtype, M=mean.dtype),
        grid=(max(spec.n * spec.c, 1), 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[x.shape], output_dtypes=[x.dtype],
    )[0]


def _backward(spec: _Spec, x, y, ct, w, b, mean, var, ct_mean, ct_var):
    """(dx, dweight, dbias, g): g = ct * act'(z) is the residual's gradient
    (None without a residual)."""
    p = spec.chunks
    tmpl = spec.template(T=x.dtype, W=w.dtype, M=mean.dtype)
    y_in = y if spec.residual else _placeholder()
    (part,) = _kernel("norm_grad_stats")(
        inputs=[x, y_in, ct, w, b, mean, var, spec.seg(), *spec.params()], template=tmpl,
        grid=(p * spec.c, 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(3, p, spec.s, spec.c)], output_dtypes=[mx.float32],
    )
    if not spec.stat_ct:
        ct_mean = ct_var = _placeholder()
    coef, dw, db = _kernel("norm_grad_merge")(
        inputs=[part, w, var, ct_mean, ct_var, *spec.params()], template=spec.template(W=w.dtype, M=var.dtype),
        grid=(spec.c * MERGE_THREADS, 1, 1), threadgroup=(MERGE_THREADS, 1, 1),
        output_shapes=[(3, spec.s, spec.c), (spec.c,), (spec.c,)],
        output_dtypes=[mx.float32, w.dtype, w.dtype],
    )
    dx, dr = _kernel("norm_grad_apply")(
        inputs=[x, y_in, ct, w, b, mean, var, coef, spec.seg(), *spec.params()], template=tmpl,
        grid=(max(spec.n * spec.c, 1), 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[x.shape, x.shape if spec.residual else (1,)], output_dtypes=[x.dtype, x.dtype],
    )
    return dx, dw, db, (dr if spec.residual else None)


def _check(x, weight, bias, residual, segments, n_segments, mean, var, eps, act, slope):
    if not isinstance(x, mx.array) or x.ndim != 2:
        raise ValueError("norm_act: x must have shape (N, C)")
    if x.dtype not in (mx.float32, mx.float16, mx.bfloat16):
        raise TypeError(f"norm_act: x must be float32, float16 or bfloat16, got {x.dtype}")
    c = x.shape[1]
    for what, a in (("weight", weight), ("bias", bias)):
        if a.ndim != 1 or a.shape[0] != c:
            raise ValueError(f"norm_act: {what} must have shape (C,) with C = x.shape[1]")
    if act not in (0, 1, 2):
        raise ValueError("norm_act: act must be 0 (identity), 1 (relu) or 2 (leaky relu)")
    if act == 2 and not slope >= 0:
        raise ValueError("norm_act: the leaky relu slope must be >= 0")
    if not eps > 0:
        raise ValueError("norm_act: eps must be positive")
    if n_segments < 1:
        raise ValueError("norm_act: n_segments must be >= 1")
    if (mean is None) != (var is None):
        raise ValueError("norm_act: give both mean and var (eval mode) or neither")
    if segments is None and n_segments != 1:
        raise ValueError("norm_act: n_segments > 1 needs segment ids")
    if mean is not None:
        if segments is not None:
            raise ValueError("norm_act: given statistics are per channel; no segments in eval mode")
        for what, a in (("mean", mean), ("var", var)):
            if a.ndim != 1 or a.shape[0] != c:
                raise ValueError(f"norm_act: {what} must have shape (C,) with C = x.shape[1]")
    if residual is not None and (tuple(residual.shape) != tuple(x.shape) or residual.dtype != x.dtype):
        raise ValueError("norm_act: residual must match x in shape and dtype")
    if segments is not None and (segments.ndim != 1 or segments.shape[0] != x.shape[0]):
        raise ValueError("norm_act: segments must have shape (N,)")


def _f32(a: mx.array) -> mx.array:
    return a if a.dtype == mx.float32 else a.astype(mx.float32)


def norm_act(x, weight, bias, residual, segments, n_segments, mean, var, eps, act, slope):
    """The CUDA form of ``_ext.norm_act`` (same arguments and results):
    ``[y, mean, var]`` in training (``mean`` and ``var`` None: statistics of
    x, float32 (n_segments, C)), ``[y]`` in eval mode (given (C,)
    statistics, any float dtype). ``act``: 0 identity, 1 ReLU, 2
    LeakyReLU(slope >= 0)."""
    return _norm_act(x, weight, bias, residual, segments, n_segments, mean, var, eps, act, slope, True)


def norm_act_layer(x, weight, bias, residual, segments, n_segments, mean, var, eps, act, slope):
    """:func:`norm_act` for the normalisation layers, which read a training
    call's statistics only for their running statistics: those come without
    gradient (made outside the custom function, from x cut from the graph),
    the same values. The custom function then has one output, so reverse
    mode makes no zero cotangents for the statistics (four primitives and
    two cut outputs fewer per norm in a training step)."""
    return _norm_act(x, weight, bias, residual, segments, n_segments, mean, var, eps, act, slope, False)


def norm_act_running(x, weight, bias, residual, eps, act, slope, running_mean, running_var, keep, mu, ratio):
    """A batch norm layer's training call with its running statistics:
    ``[y, new running mean, new running var]``, :func:`norm_act_layer` with
    float32 (C,) running statistics updated in the statistics' merge kernel
    (the bits of :func:`running_stats`, one kernel fewer)."""
    c = x.shape[1] if isinstance(x, mx.array) and x.ndim == 2 else -1
    for name, a in (("running_mean", running_mean), ("running_var", running_var)):
        if a.dtype != mx.float32 or a.shape != (c,):
            raise ValueError(f"norm_act_running: {name} must be float32 of shape (C,) with C = x.shape[1], "
                             f"got {a.dtype} {tuple(a.shape)}")
    return _norm_act(x, weight, bias, residual, None, 1, None, None, eps, act, slope, False,
                     (running_mean, running_var, keep, mu, ratio))


def _norm_act(x, weight, bias, residual, segments, n_segments, mean, var, eps, act, slope, stat_ct,
              running=None):
    _check(x, weight, bias, residual, segments, n_segments, mean, var, eps, act, slope)
    training = mean is None
    n, c = x.shape
    if n == 0:
        if running is not None:
            return [x, *running[:2]]
        stats = mx.zeros((n_segments, c), mx.float32)
        return [x, stats, stats] if training else [x]
    low = 1.0 if act == 0 else 0.0 if act == 1 else float(slope)
    if segments is None:
        # Without segments a call is fixed by its sizes and flags: its spec
        # and custom function are made once (a step's norms then skip
        # remaking them).
        key = (n, c, n_segments, training, residual is not None, float(eps), low, stat_ct)
        hit = _FUNCTIONS.get(key)
        if hit is None:
            if len(_FUNCTIONS) >= 1024:
                _FUNCTIONS.clear()
            spec = _Spec(n, c, None, n_segments, training, residual is not None, float(eps), low, stat_ct)
            hit = _FUNCTIONS[key] = (spec, _function(spec))
        spec, f = hit
    else:
        seg = segments.astype(mx.int32)
        spec = _Spec(n, c, seg, n_segments, training, residual is not None, float(eps), low, stat_ct)
        f = None
    # weight, bias and given statistics in their own dtypes (the kernels
    # widen them), so that no casts join the graph
    prims = [x, weight, bias]
    if training and not spec.stat_ct:
        stats = _statistics(spec, mx.stop_gradient(x), running)
        mean, var = stats[:2]
    if not spec.stat_ct:
        prims += [mean, var]
    if residual is not None:
        prims.append(residual)
    out = (f or _function(spec))(*prims)
    if running is not None:
        return [out[0], *stats[2:]]
    return [out[0], mean, var] if training and not spec.stat_ct else out


_FUNCTIONS: dict = {}


@functools.lru_cache(maxsize=256)
def _coefficients(keep: float, mu: float, ratio: float) -> mx.array:
    return mx.array(np.array((keep, mu, ratio), np.float32))


def running_stats(mean, var, batch_mean, batch_var, keep, mu, ratio):
    """The contract of ``_ext.running_stats`` in one kernel: float32 (C,)
    running statistics and a training call's float32 (1, C) batch
    statistics (any shape holding C values) to the new running statistics."""
    c = mean.size
    for name, a in (("mean", mean), ("var", var), ("batch_mean", batch_mean), ("batch_var", batch_var)):
        if a.dtype != mx.float32:
            raise ValueError(f"running_stats: {name} must be float32, got {a.dtype}")
        if a.size != c:
            raise ValueError(f"running_stats: {name} must hold {c} values, got shape {tuple(a.shape)}")
    if c == 0:
        return mean, var
    coef = _coefficients(float(keep), float(mu), float(ratio))
    return _kernel("running_stats")(
        inputs=[mean, var, batch_mean, batch_var, jit.params(c), coef],
        grid=(c, 1, 1), threadgroup=(min(256, c), 1, 1),
        output_shapes=[(c,), (c,)], output_dtypes=[mx.float32, mx.float32],
    )


def _unpack(spec: _Spec, prims):
    x, w, b = prims[:3]
    rest = list(prims[3:])
    mean = var = None
    if not spec.stat_ct:  # given (eval) or made outside without gradient (norm_act_layer)
        mean, var = rest[:2]
        rest = rest[2:]
    r = rest[0] if spec.residual else None
    return x, w, b, mean, var, r


def _function(spec: _Spec):
    def forward(*prims):
        # stop_gradient keeps forward-mode tracing out of the kernels (the
        # JVP is f_jvp); reverse mode goes through f_vjp. Three kernels in
        # training, one in eval mode.
        x, w, b, mean, var, r = _unpack(spec, prims)
        x, w, b = mx.stop_gradient(x), mx.stop_gradient(w), mx.stop_gradient(b)
        if r is not None:
            r = mx.stop_gradient(r)
        if not spec.training:  # given statistics (a training call's were made without gradient)
            mean, var = mx.stop_gradient(mean), mx.stop_gradient(var)
        if spec.stat_ct:
            mean, var = _statistics(spec, x)
            return [_apply(spec, x, w, b, mean, var, r), mean, var]
        return [_apply(spec, x, w, b, mean, var, r)]

    f = mx.custom_function(forward)

    @f.vjp
    def f_vjp(prims, cotangents, outputs):
        x, w, b, mean, var, r = _unpack(spec, prims)
        y = outputs[0]
        if spec.stat_ct:
            mean, var = outputs[1], outputs[2]
            ct_mean, ct_var = _f32(cotangents[1]), _f32(cotangents[2])
        else:
            ct_mean = ct_var = None
        ct = cotangents[0].astype(x.dtype)
        dx, dw, db, g = _backward(spec, x, y, ct, w, b, mean, var, ct_mean, ct_var)
        grads = [dx, dw, db]
        if not spec.training:
            grads += list(autodiff.norm_given_stats_vjp(w, var, dw, db, spec.eps, mean.dtype, var.dtype))
        elif not spec.stat_ct:
            # statistics made without gradient: x's gradient carries their
            # dependence on x; MLX asks nothing for these two (their own
            # arrays stand in, no new nodes)
            grads += [mean, var]
        if spec.residual:
            grads.append(g)
        return grads

    @f.jvp
    def f_jvp(prims, tangents):
        return _jvp(spec, forward, prims, tangents)

    return f


def _jvp(spec: _Spec, forward, prims, tangents):
    """Forward mode: autodiff.norm_act_jvp, the rule of every backend."""
    x, w, _, mean, var, _ = _unpack(spec, prims)
    outs = forward(*prims)
    if spec.stat_ct:
        mean, var = outs[1], outs[2]
    roles = ["x", "w", "b"] + (["mean", "var"] if not spec.stat_ct else []) + (["r"] if spec.residual else [])
    # a training call's statistics made without gradient take no tangent
    pairs = [(role, t) for role, t in zip(roles, tangents)
             if t is not None and (role not in ("mean", "var") or not spec.training)]
    dy, d_mean, d_var = autodiff.norm_act_jvp(x, w, outs[0], mean, var, spec.segments, spec.s, spec.training,
                                             spec.eps, spec.low, pairs)
    return [dy, d_mean, d_var] if spec.stat_ct else [dy]
