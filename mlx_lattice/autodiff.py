"""The autodiff rules of the convolution products, written once for every
backend.

Two bilinear products carry a network's convolutions:

- ``conv``: ``y[r] = sum over the edges (r, g, k) of a view of x[g] @ W[k]``;
- ``weight_grad``: ``dW[k] = sum over the edges of offset k of x[g]^T ct[r]``.

Their derivatives are products of the same two kinds. For ``conv``, the input
gradient is ``conv`` of the cotangent through ``W^T`` over the view with
roles exchanged (the flipped view; where the relation is symmetric, the same
view with the offsets mirrored, which needs no flipped view at all), and the
weight gradient is ``weight_grad``; for ``weight_grad``, the gradients are a
flipped ``conv`` through the cotangent transposed and a forward ``conv``.
Forward-mode derivatives are the bilinear sums ``f(tx, b) + f(a, tb)``.

Each derived product asks the route registry for its own route (recorded
like any call, through the route tuner) and runs that route's kernels on the
backend that ran the product (``Backend.launch``). The views a backend hands
out (``Backend.product_view``) answer ``rows``, ``kind``, ``edges``,
``symmetric`` and ``flipped()`` (``backends.base.ProductView``).

Where the products are the extension's primitives (CPU and Metal:
``Backend.differentiable_products``), the primitives' own vjp and jvp call
these rules (the extension calls :func:`primitive_rule` by name), so each
product is one graph node; a backend whose kernels carry no autodiff (CUDA)
runs them inside an ``mx.custom_function`` with these rules as its VJP and
JVP.

The extension's other differentiable primitives take their rules from here
too: ``QuantizedConv`` (the input gradient, a derived ``conv``; quantized
weights take none) and ``NormAct``, whose backward pass is a kernel of each
backend (``NormActGrad``, CUDA's ``norm_grad_*``) and whose remaining
derivatives (given statistics, forward mode) are :func:`norm_given_stats_vjp`
and :func:`norm_act_jvp` for every backend.

A weight is kernel-major ``(K, A / groups, B)`` or the parameter itself
(``layout.is_parameter``: the CPU routes read it in place); a weight's
gradient comes back in the weight's own layout.
"""

from __future__ import annotations

import mlx.core as mx

from . import _ext, backends, layout, routes
from ._args import dtype_name
from ._segment import segment_sum
from .backends.native import NativeView


def context(backend: str, direction: str, view, k: int, a: int, b: int, rows_in: int, dtype,
            from_route: str, groups: int = 1) -> routes.RouteContext:
    """The RouteContext of a derived product on ``backend``: ``rows_in`` rows
    of ``a`` channels through ``view`` (None: pointwise) into ``b`` channels
    (the route tuner builds the same ones ahead of the backward pass)."""
    pointwise = view is None
    return routes.context(
        f"{direction} of {from_route}",
        backend,
        map_kind="forward" if pointwise else view.kind,
        dtype=dtype if isinstance(dtype, str) else dtype_name(dtype),
        kernel_size=(1, 1, 1) if pointwise else None,
        k=k, c_in=a, c_out=b, n_in=rows_in,
        n_out=rows_in if pointwise else view.rows,
        edges=rows_in if pointwise else view.edges,
        direction=direction, groups=groups,
    )


def _route(backend, direction, view, k, a, b, rows_in, dtype, from_route, groups):
    """(route name, variant) the registry chooses for a derived product."""
    sel = routes.choose(context(backend.name, direction, view, k, a, b, rows_in, dtype, from_route, groups))
    return sel.route.name, sel.variant


def transpose(w: mx.array, groups: int = 1) -> mx.array:
    """(K, A / G, B) -> (K, B / G, A): each group's block transposed."""
    if groups == 1:
        return mx.swapaxes(w, 1, 2)
    k, ag, b = w.shape
    blocks = w.reshape(k, ag, groups, b // groups).transpose(0, 3, 2, 1)
    return blocks.reshape(k, b // groups, ag * groups)


# How a ``conv`` reads its weight w: (transposed, mirrored), the product
# multiplying by W[k]^T and / or W[K - 1 - k]. Both are involutions and
# commute, so flips compose by exclusive or. A route gets w itself with the
# readings it makes in place (``Backend.flips_in_place``), and w flipped by
# MLX ops (a transpose and a copy per call) for the others.
NO_FLIP = (False, False)


def flipped_weight(w: mx.array, flip: tuple, groups: int = 1) -> mx.array:
    """The weight a product with ``flip`` multiplies by, made by MLX ops."""
    if flip[0]:
        w = transpose(w, groups)
    return w[::-1] if flip[1] else w


def launch_operands(backend, route: str, w: mx.array, flip: tuple, groups: int = 1):
    """(weight, keyword arguments) a ``conv`` product launches with: w
    flipped by MLX ops as far as the route does not read it so in place,
    and the rest of ``flip`` for the route."""
    if flip == NO_FLIP:
        return w, {}
    in_place = backend.flips_in_place(route, groups)
    made = tuple(f and not p for f, p in zip(flip, in_place))
    rest = tuple(f and p for f, p in zip(flip, in_place))
    if made != NO_FLIP:
        w = flipped_weight(layout.kernel_major(w), made, groups)
    return w, ({"flip": rest} if rest != NO_FLIP else {})


def input_gradient_view(view):
    """(view, mirrored) of the input gradient of a ``conv`` over ``view``:
    the flipped view, or on a symmetric relation the same view read with
    the offsets mirrored (dx[p] = sum over edges (p, q, k) of ct[q]
    W[K - 1 - k]^T), so that no flipped view is built; None for a
    pointwise product. The one place this is decided: every backend's map
    builder marks a symmetric relation, and each runs the mirrored reading its
    way (CUDA stages W mirrored; the extension reads a relation it built
    symmetric through its other view, which it makes from its own CSR)."""
    if view is None:
        return None, False
    if view.symmetric:
        return view, True
    return view.flipped(), False


def _out_channels(w: mx.array, flip: tuple, groups: int) -> int:
    _, a, b = layout.kernel_dims(w.shape)
    return a * groups if flip[0] else b


def _bilinear_jvp(f, a, b, ta, tb, zeros):
    """JVP of f, linear in each argument: f(ta, b) + f(a, tb), a term per
    tangent given; zeros() when none is."""
    terms = []
    if ta is not None:
        terms.append(f(ta, b))
    if tb is not None:
        terms.append(f(a, tb))
    return sum(terms[1:], terms[0]) if terms else zeros()


def _conv_vjp(backend, route, view, groups, flip, x, w, ct, argnums):
    """The gradients of conv's operands in ``argnums`` (0: x, 1: w), in
    that order: dx multiplies the cotangent by the product's weight
    transposed (and mirrored on a symmetric view: w read with the flip
    composed), dw is a weight gradient in w's own layout."""
    k, _, _ = layout.kernel_dims(w.shape)
    a, b = x.shape[1], ct.shape[1]
    out = []
    for arg in argnums:
        if arg == 0:
            back, mirrored = input_gradient_view(view)
            back_flip = (not flip[0], flip[1] != mirrored)
            r_d, v_d = _route(backend, "dgrad", back, k, b, a, ct.shape[0], x.dtype, route, groups)
            out.append(conv(backend, r_d, ct, w, back, groups, v_d, back_flip))
        else:
            r_w, v_w = _route(backend, "wgrad", view, k, a, b, x.shape[0], x.dtype, route, groups)
            if flip == NO_FLIP:
                out.append(weight_grad(backend, r_w, x, ct, view, k, groups, v_w, like=w))
            else:
                # the flipped weight's gradient, flipped back (flips are involutions)
                dw = flipped_weight(weight_grad(backend, r_w, x, ct, view, k, groups, v_w), flip, groups)
                out.append(layout.like(dw, w))
    return out


def _weight_grad_vjp(backend, route, view, k, groups, x, ct, cotangent, argnums):
    """The gradients of weight_grad's operands in ``argnums`` (0: x, 1: ct):
    a flipped conv through the cotangent transposed and a forward conv."""
    a, b = x.shape[1], ct.shape[1]
    out = []
    for arg in argnums:
        if arg == 0:
            back = None if view is None else view.flipped()
            r_x, v_x = _route(backend, "dgrad", back, k, b, a, ct.shape[0], x.dtype, route, groups)
            out.append(conv(backend, r_x, ct, cotangent, back, groups, v_x, (True, False)))
        else:
            r_c, v_c = _route(backend, "forward", view, k, a, b, x.shape[0], x.dtype, route, groups)
            out.append(conv(backend, r_c, x, cotangent, view, groups, v_c))
    return out


def conv(backend, route: str, x: mx.array, w: mx.array, view, groups: int = 1,
         variant: dict | None = None, flip: tuple = NO_FLIP) -> mx.array:
    """y = sum over the edges of x[g] @ W[k] on ``view`` (None: pointwise) by
    ``route`` on ``backend``, with VJP and JVP; W kernel-major (K, A /
    groups, B) read from ``w`` (kernel-major, or the parameter where the
    backend reads it: ``layout``), or ``w`` read with ``flip`` (the input
    gradient's W^T, without a copy where the route can); ``variant``: the
    route's tile shapes."""
    if backend.differentiable_products:
        # the primitive differentiates itself through the rules (_product_rule)
        wl, kw = launch_operands(backend, route, w, flip, groups)
        return backend.launch(route, "conv", x, wl, view, groups=groups, variant=variant, **kw)

    @mx.custom_function
    def f(x, w):
        # stop_gradient keeps forward-mode tracing out of the kernels, which
        # have no JVP (the JVP is f_jvp below); reverse mode goes through
        # f_vjp anyway.
        wl, kw = launch_operands(backend, route, mx.stop_gradient(w), flip, groups)
        return backend.launch(route, "conv", mx.stop_gradient(x), wl, view, groups=groups, variant=variant, **kw)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        x, w = primals
        return tuple(_conv_vjp(backend, route, view, groups, flip, x, w, cotangent, (0, 1)))

    @f.jvp
    def f_jvp(primals, tangents):
        return _conv_jvp(backend, route, view, groups, variant, flip, *primals, *tangents)

    return f(x, w)


def _conv_jvp(backend, route, view, groups, variant, flip, x, w, tx, tw):
    rows = x.shape[0] if view is None else view.rows
    return _bilinear_jvp(
        lambda u, v: conv(backend, route, u, v, view, groups, variant, flip), x, w, tx, tw,
        lambda: mx.zeros((rows, _out_channels(w, flip, groups)), x.dtype))


def weight_grad(backend, route: str, x: mx.array, ct: mx.array, view, k: int, groups: int = 1,
                variant: dict | None = None, like=None) -> mx.array:
    """dW[k] = sum over the edges of offset k of x[g]^T ct[r] on ``view``
    (None: pointwise, K = 1) by ``route`` on ``backend``, with VJP and JVP;
    groups > 1: each group's block, (K, A / groups, B). ``like``: a
    parameter-layout weight (or its shape) whose layout the result takes,
    which the backend writes directly where it reads that layout."""
    shape = None if like is None else tuple(getattr(like, "shape", like))
    if shape is not None and not layout.is_parameter(shape):
        shape = None
    if backend.differentiable_products:
        return _launch_weight_grad(backend, route, x, ct, view, k, groups, variant, shape)

    @mx.custom_function
    def f(x, ct):
        return _launch_weight_grad(backend, route, mx.stop_gradient(x), mx.stop_gradient(ct), view, k,
                                   groups, variant, shape)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        x, ct = primals
        return tuple(_weight_grad_vjp(backend, route, view, k, groups, x, ct, cotangent, (0, 1)))

    @f.jvp
    def f_jvp(primals, tangents):
        return _weight_grad_jvp(backend, route, view, k, groups, variant, shape, *primals, *tangents)

    return f(x, ct)


def _launch_weight_grad(backend, route, x, ct, view, k, groups, variant, shape):
    """The product, in ``shape``'s parameter layout where given: written so
    by a backend that reads that layout, else rearranged by MLX ops."""
    if shape is None:
        return backend.launch(route, "weight_grad", x, ct, view, k=k, groups=groups, variant=variant)
    if backend.reads_parameter(route):
        return backend.launch(route, "weight_grad", x, ct, view, k=k, groups=groups, variant=variant,
                              shape=shape)
    dw = backend.launch(route, "weight_grad", x, ct, view, k=k, groups=groups, variant=variant)
    return layout.like(dw, shape)


def _weight_grad_jvp(backend, route, view, k, groups, variant, shape, x, ct, tx, tct):
    zeros = shape if shape is not None else (k, x.shape[1] // groups, ct.shape[1])
    return _bilinear_jvp(
        lambda u, v: weight_grad(backend, route, u, v, view, k, groups, variant, shape), x, ct, tx, tct,
        lambda: mx.zeros(zeros, x.dtype))


def primitive_rule(mode, prim, primals, seeds, argnums, outputs):
    """A transform of one of the extension's primitives (``mode`` "vjp":
    seeds are the outputs' cotangents, one gradient per argnum comes back;
    "jvp": seeds are the argnums' tangents, one tangent per output).
    ``prim`` is the primitive itself (``_ext.GatherConv``, ``WeightGrad``,
    ``QuantizedConv``, ``NormAct``), read for what it carries and not kept."""
    return _RULES[prim.name](mode == "vjp", prim, list(primals), list(seeds), list(argnums),
                             list(outputs))


def _product_rule(reverse, prim, primals, seeds, argnums, outputs):
    """GatherConv and WeightGrad: the product rebuilt from what the
    primitive carries (its route, whose backend runs the derived products,
    relation, view and flags)."""
    route = prim.route
    backend = backends.get(route.split(".", 1)[0])
    native = prim.relation
    view = None if native is None else backend.native_view(native, prim.view)
    flip, groups = tuple(prim.flip), prim.groups
    a, b = primals[0], primals[1]
    t = dict(zip(argnums, seeds))
    if prim.name == "SparseGatherConv":
        if reverse:
            return _conv_vjp(backend, route, view, groups, flip, a, b, seeds[0], argnums)
        return [_conv_jvp(backend, route, view, groups, None, flip, a, b, t.get(0), t.get(1))]
    k = prim.kernel_volume
    shape = None if prim.shape is None else tuple(prim.shape)
    if reverse:
        return _weight_grad_vjp(backend, route, view, k, groups, a, b, seeds[0], argnums)
    return [_weight_grad_jvp(backend, route, view, k, groups, None, shape, a, b, t.get(0), t.get(1))]


def _quantized_rule(reverse, prim, primals, seeds, argnums, outputs):
    """QuantizedConv (inputs x, codes, scales, biases, then the view's
    arrays): x's gradient is a conv of the cotangent through the
    dequantized weight transposed, over the flipped view, by the route the
    registry picks; forward mode is the product of x's tangent. The packed
    weights take no gradient (they raise), the view's integers zeros."""
    if any(1 <= arg <= 3 for arg in argnums):
        raise ValueError("gradients through a QuantizedWeight are not supported (inference "
                         "only); call .dequantize() and use the float weight to train")
    x, codes, scales, biases = primals[:4]
    route = prim.route
    native = prim.relation
    with mx.stream(prim.stream):
        if not reverse:
            if 0 in argnums:
                return [_ext.quantized_conv(seeds[argnums.index(0)], codes, scales, biases, prim.bits,
                                            prim.group_size, native, prim.view, route, prim.stream)]
            rows = x.shape[0] if native is None else NativeView(native, prim.view).rows
            return [mx.zeros((rows, codes.shape[0]), x.dtype)]
        backend = backends.get(route.split(".", 1)[0])
        out = []
        for arg in argnums:
            if arg != 0:
                out.append(mx.zeros_like(primals[arg]))
                continue
            # (B, K, A) -> (K, A, B), then W^T per offset
            w = mx.dequantize(codes, scales, biases, group_size=prim.group_size, bits=prim.bits,
                              mode="affine", dtype=x.dtype)
            wt = mx.swapaxes(mx.transpose(w, (1, 2, 0)), 1, 2)
            back = None if native is None else NativeView(native, prim.view).flipped()
            ct = seeds[0]
            k, a, b = w.shape[1], x.shape[1], codes.shape[0]
            r_d, v_d = _route(backend, "dgrad", back, k, b, a, ct.shape[0], x.dtype, route, 1)
            out.append(conv(backend, r_d, ct, wt, back, 1, v_d))
        return out


# ------------------------------------------------------------ norm + act

def norm_given_stats_vjp(w, var, dweight, dbias, eps: float, mean_dtype, var_dtype):
    """The gradients of a NormAct's given (eval) statistics from its
    backward pass's dweight = sum g xhat and dbias = sum g: d mean = -w inv
    sum g, d var = -w inv^2 sum g xhat / 2, inv = 1 / sqrt(var + eps)."""
    inv = mx.rsqrt(var.astype(mx.float32) + eps)
    wi = w.astype(mx.float32) * inv
    d_mean = -(wi * dbias.astype(mx.float32))
    d_var = wi * inv * (dweight.astype(mx.float32) * -0.5)
    return d_mean.astype(mean_dtype), d_var.astype(var_dtype)


def norm_act_jvp(x, w, y, mean, var, segments, n_segments: int, training: bool, eps: float, low: float,
                 tangents):
    """Forward mode of a NormAct, from MLX ops: (dy, d mean, d var) of y =
    act(w xhat + b [+ r]) with xhat = (x - mean_s) inv_s, the statistics
    (float32 (S, C)) of the training call or given (eval). ``tangents``:
    (role, tangent) pairs in input order, roles "x", "w", "b", "r" and in
    eval mode "mean", "var"; ``low``: act'(z) for z <= 0; ``segments``: each
    row's segment id (int32) or None."""
    c = x.shape[1]
    f32 = mx.float32
    mean, var = mean.astype(f32), var.astype(f32)
    inv = mx.rsqrt(var + eps)
    count = None
    if segments is not None:
        count = mx.zeros((n_segments, 1), f32).at[segments].add(mx.ones((x.shape[0], 1), f32))

    def rows(a):
        return a if segments is None else mx.take(a, segments, axis=0)

    def seg_mean(v):
        if segments is None:
            return mx.mean(v, axis=0, keepdims=True)
        # segment_sum: in row order on every device (a GPU's scatter-add
        # commits rows as its atomics land)
        return segment_sum(v, segments, n_segments) / mx.maximum(count, 1.0)

    inv_r = rows(inv)
    xhat = (x.astype(f32) - rows(mean)) * inv_r
    dz = dxhat = mx.zeros(x.shape, f32)
    d_mean = d_var = mx.zeros((n_segments, c), f32)
    for role, t in tangents:
        t = t.astype(f32)
        if role == "x":
            if training:
                m1 = seg_mean(t)
                m2 = seg_mean(t * xhat)
                dxhat = dxhat + inv_r * ((t - rows(m1)) - xhat * rows(m2))
                d_mean = m1
                d_var = (m2 * 2.0) / inv
            else:
                dxhat = dxhat + t * inv_r
        elif role == "w":
            dz = dz + t * xhat
        elif role in ("b", "r"):
            dz = dz + t
        elif role == "mean":
            dxhat = dxhat - t * inv
        elif role == "var":
            dxhat = dxhat + xhat * (t * ((inv * inv) * -0.5))
    dz = dz + w.astype(f32) * dxhat
    slope = mx.where(y > 0, 1.0, low)
    return (dz * slope).astype(x.dtype), d_mean, d_var


def _norm_roles(prim) -> dict:
    """NormAct's differentiable inputs: argnum -> role (the segment ids and
    running statistics take no derivative)."""
    roles = {0: "x", 1: "w", 2: "b"}
    nxt = 3
    if not prim.training:
        roles.update({3: "mean", 4: "var"})
        nxt = 5
    if prim.residual:
        roles[nxt] = "r"
    return roles


def _norm_rule(reverse, prim, primals, seeds, argnums, outputs):
    """NormAct (``_ext.norm_act``'s inputs and outputs): reverse mode runs
    NormActGrad (dx, dweight, dbias and the residual's g) and adds the given
    statistics' gradients; forward mode is :func:`norm_act_jvp`."""
    roles = _norm_roles(prim)
    training = prim.training
    with mx.stream(prim.stream):
        if reverse:
            grads = prim.backward(primals, seeds, outputs)
            w, var = primals[1], primals[4] if not training else None
            out = []
            for arg in argnums:
                role = roles.get(arg)
                if role in ("x", "w", "b", "r"):
                    out.append(grads[{"x": 0, "w": 1, "b": 2, "r": 3}[role]])
                elif role in ("mean", "var"):
                    d_mean, d_var = norm_given_stats_vjp(w, var, grads[1], grads[2], prim.eps, mx.float32,
                                                         mx.float32)
                    out.append(d_mean if role == "mean" else d_var)
                else:
                    out.append(mx.zeros_like(primals[arg]))
            return out
        x, w = primals[0], primals[1]
        mean, var = (outputs[1], outputs[2]) if training else (primals[3], primals[4])
        segments = primals[max(roles) + 1] if prim.segmented else None
        tangents = [(roles[arg], t) for arg, t in zip(argnums, seeds) if arg in roles]
        dy, d_mean, d_var = norm_act_jvp(x, w, outputs[0], mean, var, segments, prim.segments, training,
                                         prim.eps, prim.low, tangents)
        if not training:
            return [dy]
        if not prim.stats_grad:
            d_mean = d_var = mx.zeros((prim.segments, x.shape[1]), mx.float32)
        if prim.running:
            # the running statistics are state: no tangent
            none = mx.zeros((x.shape[1],), mx.float32)
            return [dy, d_mean, d_var, none, none]
        return [dy, d_mean, d_var]


_RULES = {
    "SparseGatherConv": _product_rule,
    "SparseWeightGrad": _product_rule,
    "SparseQuantizedConv": _quantized_rule,
    "SparseNormAct": _norm_rule,
}

