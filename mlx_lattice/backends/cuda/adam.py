"""Adam / AdamW on CUDA over many parameters per launch.

MLX runs an optimizer's update per parameter: under ``mx.compile`` one
fused kernel each, about 150 launches for a MinkUNet, each a primitive the
host dispatches. Here up to ``GROUP`` parameters of one dtype and rank go
through one kernel: one thread per element of the group, which finds its
parameter among the group's sizes (passed by value) and applies the update
of ``mlx.optimizers.Adam`` / ``AdamW`` to it.

Every operation rounds to the parameters' dtype in MLX's order, as MLX's
own ops do: the coefficients (b1, 1 - b1, b2, 1 - b2, eps) are rounded to
that dtype first (a Python float becomes an array of the other operand's
dtype), and each product, sum, square root and quotient is rounded once;
no fused multiply-add. The per-step scalars (learning rate or
lr / (1 - b1^t), 1 / sqrt(1 - b2^t), 1 - lr * weight_decay) come from
``optimizers._FusedAdam._step_scalars`` in float32 and are rounded to the
dtype here. Float32 updates therefore give the bits of MLX's eager update;
half-precision ones may differ from it by an ulp where a float computation
rounded to half differs from MLX's half arithmetic.
"""

from __future__ import annotations

import functools

import numpy as np
import mlx.core as mx

from . import jit

# Parameters per launch (the sizes fill the 16 scalar parameters).
GROUP = 16

_NAMES = [f"{p}{i}" for p in ("g", "p", "m", "v") for i in range(GROUP)]
_OUT_NAMES = [f"{p}{i}" for p in ("po", "mo", "vo") for i in range(GROUP)]


def _source() -> str:
    picks = "\n".join(
        f"    case {i}: g = g{i}; p = p{i}; m = m{i}; v = v{i}; po = po{i}; mo = mo{i}; vo = vo{i}; break;"
        for i in range(GROUP)
    )
    return """
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  long start = 0;
  int t = 0;
  for (; t < GROUP; ++t) {
    if (idx < start + params[t]) break;
    start += params[t];
  }
  if (t == GROUP) return;
  const long i = idx - start;
  const T *g, *p, *m, *v;
  T *po, *mo, *vo;
  switch (t) {
""" + picks + """
    default: return;
  }
  // r(): one rounding to the parameters' dtype (identity for float32)
  auto r = [](float a) { return static_cast<float>(static_cast<T>(a)); };
  const float b1 = r(coef[0]), ob1 = r(coef[1]), b2 = r(coef[2]), ob2 = r(coef[3]), eps = r(coef[4]);
  const float lr = r(scal[0]), c2 = r(scal[1]);
  const float gv = static_cast<float>(g[i]);
  float pv = static_cast<float>(p[i]);
  if (DECAY) pv = r(__fmul_rn(pv, r(scal[2])));
  const float mv = r(__fadd_rn(r(__fmul_rn(b1, static_cast<float>(m[i]))), r(__fmul_rn(ob1, gv))));
  const float vv = r(__fadd_rn(r(__fmul_rn(b2, static_cast<float>(v[i]))), r(__fmul_rn(ob2, r(__fmul_rn(gv, gv))))));
  const float root = r(__fsqrt_rn(vv));
  const float den = BIAS ? r(__fadd_rn(r(__fmul_rn(root, c2)), eps)) : r(__fadd_rn(root, eps));
  const float num = r(__fmul_rn(lr, mv));
  po[i] = static_cast<T>(__fsub_rn(pv, r(__fdiv_rn(num, den))));
  mo[i] = static_cast<T>(mv);
  vo[i] = static_cast<T>(vv);
"""


_kernel = jit.Family("mlx_lattice_", {"adam": (_NAMES + ["coef", "scal", "params"], _OUT_NAMES, _source())})


DTYPES = (mx.float32, mx.float16, mx.bfloat16)


def eligible(g: mx.array, p: mx.array, state: dict) -> bool:
    """Whether one parameter can take the grouped update: gradient, moments
    and parameter of one float dtype and shape."""
    m, v = state.get("m"), state.get("v")
    return (
        isinstance(m, mx.array) and isinstance(v, mx.array) and p.dtype in DTYPES
        and g.dtype == p.dtype == m.dtype == v.dtype and g.shape == p.shape == m.shape == v.shape
    )


@functools.lru_cache(maxsize=64)
def _placeholder(dtype, ndim: int) -> mx.array:
    return mx.zeros((1,) * ndim, dtype)


@functools.lru_cache(maxsize=64)
def _coefficients(b1: float, b2: float, eps: float) -> mx.array:
    return mx.array(np.array((b1, 1 - b1, b2, 1 - b2, eps), np.float32))


def update(items, scalars: mx.array, b1: float, b2: float, eps: float, bias_correction: bool,
           decay: bool) -> list:
    """``[(new parameter, new m, new v)]`` for ``items`` = ``[(gradient,
    parameter, m, v)]`` (each :func:`eligible`), in order; ``scalars``:
    float32 (3,) (lr or c1, c2, decay factor)."""
    out: list = [None] * len(items)
    groups: dict = {}
    for n, (g, p, m, v) in enumerate(items):
        groups.setdefault((p.dtype, p.ndim), []).append(n)
    coef = _coefficients(float(b1), float(b2), float(eps))
    template = [("BIAS", bool(bias_correction)), ("DECAY", bool(decay)), ("GROUP", GROUP)]
    for (dtype, ndim), members in groups.items():
        for s in range(0, len(members), GROUP):
            part = members[s:s + GROUP]
            fill = _placeholder(dtype, ndim)
            pad = GROUP - len(part)
            cols = [[items[n][j] for n in part] + [fill] * pad for j in range(4)]
            sizes = [items[n][1].size for n in part]
            total = sum(sizes)
            if total == 0:
                for n in part:
                    out[n] = tuple(items[n][1:])
                continue
            shapes = [items[n][1].shape for n in part] + [fill.shape] * pad
            res = _kernel("adam")(
                inputs=[*cols[0], *cols[1], *cols[2], *cols[3], coef, scalars, jit.params(*sizes)],
                template=template + [("T", dtype)],
                grid=(total, 1, 1), threadgroup=(256, 1, 1),
                output_shapes=shapes * 3, output_dtypes=[dtype] * (3 * GROUP),
            )
            for j, n in enumerate(part):
                out[n] = (res[j], res[GROUP + j], res[2 * GROUP + j])
    return out
