"""Autodiff of the CUDA products: each derived product (input gradient,
weight gradient, their own derivatives) asks the route registry again,
which records it, and runs the chosen entry of the CUDA route table."""

from __future__ import annotations

import mlx.core as mx

from ... import routes as registry
from . import routes as table
from .view import View


def _context(direction, view: View | None, k, a, b, rows_in, dtype, from_route, groups=1):
    """The RouteContext of a derived product (the route tuner builds the same
    ones ahead of the backward pass)."""
    return registry.context(
        f"{direction} of {from_route}",
        "cuda",
        map_kind="forward" if view is None else view.rel.kind,
        dtype=str(dtype).replace("mlx.core.", ""),
        kernel_size=(1, 1, 1) if view is None else None,
        k=k, c_in=a, c_out=b, n_in=rows_in,
        n_out=rows_in if view is None else view.rows,
        edges=rows_in if view is None else view.rel.edges,
        direction=direction, weight_layout="mapped", groups=groups,
    )


def _route(direction, view: View | None, k, a, b, rows_in, dtype, from_route, groups=1):
    """(route name, variant) the registry chooses for a derived product."""
    sel = registry.choose(_context(direction, view, k, a, b, rows_in, dtype, from_route, groups))
    return sel.route.name, sel.variant


def _run(route: str, op: str, groups: int, *args, variant: dict | None = None):
    """Run a table entry; grouped entries also take the group count, and
    `variant` (tile shapes the route tuner chose) goes in as keywords."""
    entry = table.find(route, op)
    if groups > 1 and not entry.grouped:
        raise ValueError(f"a grouped product (groups={groups}) needs a grouped route, not {route}")
    kw = variant or {}
    return entry.run(*args, groups, **kw) if entry.grouped else entry.run(*args, **kw)


def _transpose(w: mx.array, groups: int) -> mx.array:
    """(K, A / G, B) -> (K, B / G, A): each group's block transposed."""
    if groups == 1:
        return mx.swapaxes(w, 1, 2)
    k, ag, b = w.shape
    blocks = w.reshape(k, ag, groups, b // groups).transpose(0, 3, 2, 1)
    return blocks.reshape(k, b // groups, ag * groups)


def _bilinear_jvp(f, a, b, ta, tb, zeros):
    """JVP of f, linear in each argument: f(ta, b) + f(a, tb), a term per
    tangent given; zeros() when none is."""
    terms = []
    if ta is not None:
        terms.append(f(ta, b))
    if tb is not None:
        terms.append(f(a, tb))
    return sum(terms[1:], terms[0]) if terms else zeros()


def conv(route: str, x: mx.array, w: mx.array, view: View | None, groups: int = 1,
         variant: dict | None = None) -> mx.array:
    """y = sum over edges of x[g] @ w[k] on `view` (None: pointwise), with
    VJP/JVP; groups > 1: w is (K, A / groups, B), a grouped product;
    `variant`: the route's tile shapes (cuda.routes.variants)."""

    @mx.custom_function
    def f(x, w):
        # stop_gradient keeps forward-mode tracing out of the kernel itself
        # (its JVP is f_jvp below); reverse mode goes through f_vjp anyway.
        return _run(route, "conv", groups, mx.stop_gradient(x), mx.stop_gradient(w), view,
                    variant=variant)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        x, w = primals
        k, b = w.shape[0], w.shape[2]
        a = x.shape[1]
        wt = _transpose(w, groups)
        if view is not None and view.symmetric:
            # dx[p] = sum over edges (p, q, k) of ct[q] W[K - 1 - k]^T: the
            # same view with the offsets mirrored (no flipped view or plan).
            back, wt = view, wt[::-1]
        else:
            back = None if view is None else view.flipped()
        r_d, v_d = _route("dgrad", back, k, b, a, cotangent.shape[0], x.dtype, route, groups)
        dx = conv(r_d, cotangent, wt, back, groups, v_d)
        r_w, v_w = _route("wgrad", view, k, a, b, x.shape[0], x.dtype, route, groups)
        dw = weight_grad(r_w, x, cotangent, view, k, groups, v_w)
        return dx, dw

    @f.jvp
    def f_jvp(primals, tangents):
        x, w = primals
        return _bilinear_jvp(
            lambda u, v: conv(route, u, v, view, groups, variant), x, w, *tangents,
            lambda: mx.zeros((x.shape[0] if view is None else view.rows, w.shape[2]), x.dtype))

    return f(x, w)


def weight_grad(route: str, x: mx.array, ct: mx.array, view: View | None, k: int, groups: int = 1,
                variant: dict | None = None) -> mx.array:
    """dW[k] = sum over the edges of offset k of x[g]^T ct[r], with VJP/JVP;
    groups > 1: each group's block, (K, A / groups, B); `variant`: the
    route's tile shapes (cuda.routes.variants)."""

    @mx.custom_function
    def f(x, ct):
        x, ct = mx.stop_gradient(x), mx.stop_gradient(ct)
        return _run(route, "weight_grad", groups, x, ct, view, k, variant=variant)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        x, ct = primals
        back = None if view is None else view.flipped()
        a, b = x.shape[1], ct.shape[1]
        r_x, v_x = _route("dgrad", back, k, b, a, ct.shape[0], x.dtype, route, groups)
        gx = conv(r_x, ct, _transpose(cotangent, groups), back, groups, v_x)
        r_c, v_c = _route("forward", view, k, a, b, x.shape[0], x.dtype, route, groups)
        gct = conv(r_c, x, cotangent, view, groups, v_c)
        return gx, gct

    @f.jvp
    def f_jvp(primals, tangents):
        x, ct = primals
        return _bilinear_jvp(
            lambda u, v: weight_grad(route, u, v, view, k, groups, variant), x, ct, *tangents,
            lambda: mx.zeros((k, x.shape[1] // groups, ct.shape[1]), x.dtype))

    return f(x, ct)
