"""Batch / instance norm + activation (+ residual) on GPU streams.

The same contract as the CPU primitive ``_ext.norm_act``: ``act(w * (x -
mean_s) * rsqrt(var_s + eps) + b + residual)`` with float32 statistics per
segment (one segment for batch norm, one per batch item for instance norm),
returned as extra outputs ``(y, mean, var)`` for the running statistics, or
read from the running statistics in eval mode (then ``(y,)``). Activations:
identity (code 0), ReLU (1), LeakyReLU of slope >= 0 (2), whose derivative is
read from the sign of ``y`` (the sign of the pre-activation).

It is an ``mx.custom_function`` built from MLX ops, so it serves CUDA and
Metal alike. The forward pass is ``mx.compile``d in pieces, shapeless (one
compilation serves every row and channel count; Python constants baked in,
``1 / n`` passed as an array): the statistics' reductions and a handful of
fused kernels instead of dozens of primitives. Batch statistics are MLX
reductions; per-sample sums go through ``segment_sum`` (reproducible run to
run on GPUs), and the row gathers between them stay outside the compiled
pieces (a shapeless gather would bake the channel count in). The backward
pass is closed-form (input gradient from the per-channel sums of ``g`` and
``g * xhat``; weight, bias and residual gradients, and in eval mode the
running statistics') in as few MLX ops as the formulas allow. MLX inlines
an ``mx.compile``d function whenever an input is a tracer: inside a
gradient transform every array derived from the differentiated inputs is
one, and a custom function's VJP runs with the graph retained, so there
both passes run as plain ops and only a compiled training step fuses them;
the compiled forward serves inference and eval mode. The JVP is MLX's
forward mode of the forward expressions, uncompiled.
"""

from __future__ import annotations

import numpy as np
import mlx.core as mx

from .._segment import segment_sum

_CACHE = {}


def _compiled(key, make):
    fn = _CACHE.get(key)
    if fn is None:
        fn = _CACHE[key] = mx.compile(make(), shapeless=True)
    return fn


def _act(z, code, slope):
    if code == 1:
        return mx.maximum(z, 0.0)
    if code == 2:
        return mx.where(z > 0, z, z * slope)
    return z


# -- the forward pieces, as plain functions of arrays (compiled below; the
# JVP runs them uncompiled). ``has_r``: a residual is among the inputs.

def _output_fn(code, slope, has_r):
    def output(x, mean, scale, b, *r):
        # the residual joins the bias first: one add fewer on the deepest
        # path keeps the expression within one fused kernel
        shift = b + r[0].astype(mx.float32) if has_r else b
        z = (x.astype(mx.float32) - mean) * scale + shift
        return _act(z, code, slope).astype(x.dtype)
    return output


def _batch_fn(eps, code, slope, has_r):
    """The whole batch-norm forward pass in training mode (the centred
    features computed once: inlined under a gradient, this is the op count)."""
    def batch(x, w, b, inv_n, *r):
        d = x.astype(mx.float32)
        mean = d.sum(axis=0, keepdims=True) * inv_n
        d = d - mean
        var = (d * d).sum(axis=0, keepdims=True) * inv_n
        shift = b + r[0].astype(mx.float32) if has_r else b
        rstd, scale = _rsqrt_scale(var, w, eps)
        z = d * scale + shift
        return _act(z, code, slope).astype(x.dtype), mean, var, rstd, scale
    return batch


def _scale_fn(eps):
    def scale(var, w):
        return _rsqrt_scale(var, w, eps)
    return scale


def _rsqrt_scale(var, w, eps):
    rstd = mx.rsqrt(var + eps)
    return rstd, rstd * w


def _centred_square_fn():
    def centred_square(x, mean_rows):
        d = x.astype(mx.float32) - mean_rows
        return d * d
    return centred_square


class _Forward:
    """The forward pieces of one configuration, compiled or (for the JVP) not."""

    def __init__(self, eps, code, slope, has_r, compiled=True):
        def get(make, *args):
            if not compiled:
                return make(*args)
            return _compiled((make.__name__, *args), lambda: make(*args))

        self.output = get(_output_fn, code, slope, has_r)
        self.batch = get(_batch_fn, eps, code, slope, has_r)
        # MLX 0.32.4's shapeless compile of this function crashes (a memory
        # error at evaluation) when there is a single row: run it plain.
        self.batch_one_row = _batch_fn(eps, code, slope, has_r)
        self.scale = get(_scale_fn, eps)
        self.centred_square = get(_centred_square_fn)


def _rows(a, segments):
    return a if segments is None else a[segments]


def _segment_totals(v, segments, n_seg):
    if segments is None:
        return v.sum(axis=0, keepdims=True)
    return segment_sum(v, segments, n_seg)


def _backward(x, w, b, r, g, y, mean, rstd, scale, running_var, segments, n_seg, inv_n, code, slope):
    """Closed-form gradients: x, w, b, the residual (if any) and, with fixed
    statistics (``running_var`` given; ``mean`` is then the running mean),
    the running mean and variance. ``rstd`` and ``scale`` (w * rstd) are the
    forward pass's.

    MLX evaluates a custom function's VJP with the graph retained, where
    ``mx.compile`` inlines its function, so these are plain MLX ops, as few
    as the formulas allow (a compiled training step fuses them). act'(z) is
    read from the sign of y: y = act(z) is rounded once from z and the slope
    is >= 0, so y > 0 exactly when z > 0 (but for z too small to survive
    rounding to y's dtype)."""
    d = x.astype(mx.float32) - _rows(mean, segments)
    gz = g.astype(mx.float32)
    if code == 1:
        gz = mx.where(y > 0, gz, 0.0)
    elif code == 2:
        gz = mx.where(y > 0, gz, gz * slope)
    sg = _segment_totals(gz, segments, n_seg)
    sgx = _segment_totals(gz * d, segments, n_seg) * rstd  # sum of gz * xhat
    fixed = running_var is not None
    if fixed:
        gx = gz * scale
    else:
        # dx = w rstd (gz - mean(gz) - xhat mean(gz xhat))
        k1 = scale * rstd * sgx * inv_n
        gx = (gz - _rows(sg * inv_n, segments)) * _rows(scale, segments) - d * _rows(k1, segments)
    if segments is None:
        sg_c, sgx_c = sg.reshape(-1), sgx.reshape(-1)
    else:
        sg_c, sgx_c = sg.sum(axis=0), sgx.sum(axis=0)
    grads = [gx.astype(x.dtype), sgx_c.astype(w.dtype), sg_c.astype(b.dtype)]
    if r is not None:
        grads.append(gz.astype(r.dtype))
    if fixed:
        # y depends on the running statistics too: d/dmean = -w rstd sum(gz),
        # d/dvar = -w rstd^2 sum(gz xhat) / 2.
        grads.append((-scale * sg_c).astype(mean.dtype))
        grads.append((-0.5 * scale * rstd * sgx_c).astype(running_var.dtype))
    return grads


def norm_act(f, w, b, residual, segments, counts, running_mean, running_var, eps, code, slope):
    """The GPU counterpart of ``_ext.norm_act`` (module doc). ``segments``:
    int32 row ids (None: one segment); ``counts``: rows per segment (host
    integers); ``running_mean`` / ``running_var`` (C,) for eval mode, else
    None. Returns ``(y, mean, var)`` or, in eval mode, ``(y,)``; the
    statistics (for the running statistics) carry no gradient."""
    has_r = residual is not None
    fixed = running_mean is not None
    n_seg = len(counts)
    inv = (1.0 / np.maximum(np.asarray(counts, np.float64), 1)).astype(np.float32)
    inv_n = mx.array(inv[0]) if segments is None else mx.array(inv)[:, None]

    def forward(p, x, w, b, *rest):
        r = rest[:1] if has_r else ()
        # the last two outputs, rstd and w * rstd, are kept for the VJP
        if fixed:
            rm, rv = rest[len(r):]
            rstd, scale = p.scale(rv, w)
            return p.output(x, rm, scale, b, *r), rstd, scale
        if segments is None:
            return (p.batch if x.shape[0] > 1 else p.batch_one_row)(x, w, b, inv_n, *r)
        mean = segment_sum(x, segments, n_seg) * inv_n
        mean_rows = mean[segments]
        var = segment_sum(p.centred_square(x, mean_rows), segments, n_seg) * inv_n
        rstd, scale = p.scale(var, w)
        return p.output(x, mean_rows, _rows(scale, segments), b, *r), mean, var, rstd, scale

    pieces = _Forward(eps, code, slope, has_r)
    primals = [f, w, b] + ([residual] if has_r else []) + ([running_mean, running_var] if fixed else [])

    @mx.custom_function
    def fn(*args):
        return forward(pieces, *args)

    @fn.vjp
    def fn_vjp(args, cotangents, outputs):
        x, w, b = args[:3]
        r = args[3] if has_r else None
        mean = args[-2] if fixed else outputs[1]
        return tuple(_backward(x, w, b, r, cotangents[0], outputs[0], mean, *outputs[-2:],
                               args[-1] if fixed else None, segments, n_seg, inv_n, code, slope))

    @fn.jvp
    def fn_jvp(args, tangents):
        plain = _Forward(eps, code, slope, has_r, compiled=False)
        tangents = [mx.zeros_like(a) if t is None else t for a, t in zip(args, tangents)]
        _, t = mx.jvp(lambda *a: list(forward(plain, *a)), list(args), tangents)
        return tuple(t)

    out = fn(*primals)
    if fixed:
        return out[:1]
    # The VJP above ignores the statistics' cotangents: make that explicit.
    return out[0], mx.stop_gradient(out[1]), mx.stop_gradient(out[2])
