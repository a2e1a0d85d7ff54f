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
backend that ran the product (``Backend.launch``), which carry no autodiff of
their own. The views a backend hands out (``Backend.product_view``) answer
``rows``, ``kind``, ``edges``, ``symmetric`` and ``flipped()`` (``backends.base.ProductView``).
"""

from __future__ import annotations

import mlx.core as mx

from . import _ext, backends, routes
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
    return flipped_weight(w, flip, groups), {}


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
    return w.shape[1] * groups if flip[0] else w.shape[2]


def _bilinear_jvp(f, a, b, ta, tb, zeros):
    """JVP of f, linear in each argument: f(ta, b) + f(a, tb), a term per
    tangent given; zeros() when none is."""
    terms = []
    if ta is not None:
        terms.append(f(ta, b))
    if tb is not None:
        terms.append(f(a, tb))
    return sum(terms[1:], terms[0]) if terms else zeros()


def conv(backend, route: str, x: mx.array, w: mx.array, view, groups: int = 1,
         variant: dict | None = None, flip: tuple = NO_FLIP) -> mx.array:
    """y = sum over the edges of x[g] @ W[k] on ``view`` (None: pointwise) by
    ``route`` on ``backend``, with VJP and JVP; W kernel-major (K, A /
    groups, B): ``w`` itself, or ``w`` read with ``flip`` (the input
    gradient's W^T, without a copy where the route can); ``variant``: the
    route's tile shapes."""

    @mx.custom_function
    def f(x, w):
        # stop_gradient keeps forward-mode tracing out of the kernels (the
        # JVP is f_jvp below); reverse mode goes through f_vjp anyway.
        wl, kw = launch_operands(backend, route, mx.stop_gradient(w), flip, groups)
        return backend.launch(route, "conv", mx.stop_gradient(x), wl, view, groups=groups, variant=variant, **kw)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        x, w = primals
        k, a, b = w.shape[0], x.shape[1], cotangent.shape[1]
        back, mirrored = input_gradient_view(view)
        # dx multiplies by the product's weight transposed (and mirrored on
        # a symmetric view): w read with the flip composed.
        back_flip = (not flip[0], flip[1] != mirrored)
        r_d, v_d = _route(backend, "dgrad", back, k, b, a, cotangent.shape[0], x.dtype, route, groups)
        dx = conv(backend, r_d, cotangent, w, back, groups, v_d, back_flip)
        r_w, v_w = _route(backend, "wgrad", view, k, a, b, x.shape[0], x.dtype, route, groups)
        dw = weight_grad(backend, r_w, x, cotangent, view, k, groups, v_w)
        return dx, flipped_weight(dw, flip, groups)  # in w's own layout

    @f.jvp
    def f_jvp(primals, tangents):
        x, w = primals
        rows = x.shape[0] if view is None else view.rows
        return _bilinear_jvp(
            lambda u, v: conv(backend, route, u, v, view, groups, variant, flip), x, w, *tangents,
            lambda: mx.zeros((rows, _out_channels(w, flip, groups)), x.dtype))

    return f(x, w)


def weight_grad(backend, route: str, x: mx.array, ct: mx.array, view, k: int, groups: int = 1,
                variant: dict | None = None) -> mx.array:
    """dW[k] = sum over the edges of offset k of x[g]^T ct[r] on ``view``
    (None: pointwise, K = 1) by ``route`` on ``backend``, with VJP and JVP;
    groups > 1: each group's block, (K, A / groups, B)."""

    @mx.custom_function
    def f(x, ct):
        return backend.launch(route, "weight_grad", mx.stop_gradient(x), mx.stop_gradient(ct), view,
                              k=k, groups=groups, variant=variant)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        x, ct = primals
        back = None if view is None else view.flipped()
        a, b = x.shape[1], ct.shape[1]
        r_x, v_x = _route(backend, "dgrad", back, k, b, a, ct.shape[0], x.dtype, route, groups)
        gx = conv(backend, r_x, ct, cotangent, back, groups, v_x, (True, False))
        r_c, v_c = _route(backend, "forward", view, k, a, b, x.shape[0], x.dtype, route, groups)
        gct = conv(backend, r_c, x, cotangent, view, groups, v_c)
        return gx, gct

    @f.jvp
    def f_jvp(primals, tangents):
        x, ct = primals
        return _bilinear_jvp(
            lambda u, v: weight_grad(backend, route, u, v, view, k, groups, variant), x, ct, *tangents,
            lambda: mx.zeros((k, x.shape[1] // groups, ct.shape[1]), x.dtype))

    return f(x, ct)


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
