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
these rules (a hook installed below), so each product is one graph node; a
backend whose kernels carry no autodiff (CUDA) runs them inside an
``mx.custom_function`` with these rules as its VJP and JVP.

A weight is kernel-major ``(K, A / groups, B)`` or the parameter itself
(``layout.is_parameter``: the CPU routes read it in place); a weight's
gradient comes back in the weight's own layout.
"""

from __future__ import annotations

import mlx.core as mx

from . import _ext, backends, layout, routes
from ._args import dtype_name


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
# commute, so flips compose by exclusive or. A route that reads a flipped
# weight in place (``Backend.reads_flipped``) gets w itself; any other gets
# the flipped weight made by MLX ops (a transpose and a copy per call).
NO_FLIP = (False, False)


def flipped_weight(w: mx.array, flip: tuple, groups: int = 1) -> mx.array:
    """The weight a product with ``flip`` multiplies by, made by MLX ops."""
    if flip[0]:
        w = transpose(w, groups)
    return w[::-1] if flip[1] else w


def launch_operands(backend, route: str, w: mx.array, flip: tuple, groups: int = 1):
    """(weight, keyword arguments) a ``conv`` product launches with: w and
    its flip where the route reads it in place, else the flipped weight."""
    if flip == NO_FLIP:
        return w, {}
    if groups == 1 and backend.reads_flipped(route):
        return w, {"flip": flip}
    return flipped_weight(layout.kernel_major(w), flip, groups), {}


def input_gradient_view(view):
    """(view, mirrored) of the input gradient of a ``conv`` over ``view``:
    the flipped view, or on a symmetric relation the same view read with
    the offsets mirrored (dx[p] = sum over edges (p, q, k) of ct[q]
    W[K - 1 - k]^T); None for a pointwise product."""
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


def _product_rule(mode, op, route, native, major, groups, flip, symmetric, operands, seeds, argnums,
                  out_shape):
    """The rules above for a GatherConv or WeightGrad primitive's own vjp
    (``mode`` "vjp": seeds = [cotangent], one gradient per argnum) or jvp
    (seeds: the tangents of argnums; the output's tangent). The product is
    rebuilt from what the primitive carries: its route (whose backend runs
    the derived products), relation, view and flags."""
    backend = backends.get(route.split(".", 1)[0])
    view = None if native is None else backend.native_view(native, major, symmetric)
    flip = tuple(flip)
    a, b = operands
    argnums = list(argnums)
    if op == "conv":
        if mode == "vjp":
            return _conv_vjp(backend, route, view, groups, flip, a, b, seeds[0], argnums)
        t = dict(zip(argnums, seeds))
        return [_conv_jvp(backend, route, view, groups, None, flip, a, b, t.get(0), t.get(1))]
    k, _, _ = layout.kernel_dims(out_shape)
    shape = tuple(out_shape) if layout.is_parameter(out_shape) else None
    if mode == "vjp":
        return _weight_grad_vjp(backend, route, view, k, groups, a, b, seeds[0], argnums)
    t = dict(zip(argnums, seeds))
    return [_weight_grad_jvp(backend, route, view, k, groups, None, shape, a, b, t.get(0), t.get(1))]


_ext.set_product_rule_hook(_product_rule)


def _quantized_dgrad_route(q: dict) -> str:
    """Route of the input gradient of a QuantizedWeight product, asked by
    the extension's QuantizedConv (its one derived product: quantized
    weights take no gradient)."""
    backend = backends.current().name if q["gpu"] else "cpu"
    view = None if q["kind"] == "pointwise" else _QueryView(q)
    return routes.choose(context(backend, q["direction"], view, q["k"], q["c_in"], q["c_out"],
                                 q["n_in"], q["dtype"], q["from_route"], q["groups"])).route.name


class _QueryView:
    """The view facts of the extension's route query."""

    def __init__(self, q: dict):
        self.kind, self.rows, self.edges = q["kind"], q["n_out"], q["edges"]


_ext.set_route_hook(_quantized_dgrad_route)
