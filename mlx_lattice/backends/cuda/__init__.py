"""The CUDA backend (MLX on NVIDIA GPUs): maps and products written as CUDA
sources that MLX launches (NVRTC-compiled cubins, ``jit``): no private MLX
C++ ABI is needed.

Every route computes the same product as the C++ primitives,
``y[r] = sum over the edges of row r of x[g] @ W[k]`` over a CSR view of a
relation; their autodiff is the one of every backend
(mlx_lattice/autodiff.py).

- ``kernels``: the product kernel sources; ``jit``: compiling and launching
  them (``kernel_index``: which module makes a kernel a list names);
- ``maps``: coordinate tables, supports and relations (route ``cuda.hash_map``);
- ``plans``: the views of a relation built here (``Plans``);
- ``view``: CSR views of a relation for the products;
- ``routes``: the route table (route name -> the function computing it);
- ``neighbors``: k-nearest and radius queries; ``norm``: fused norms.
"""

from __future__ import annotations

import mlx.core as mx

from ..base import Backend
from . import jit, kernel_index, maps, routes
from .kernels import sorted_mma_shared_bytes
from .plans import Plans
from .routes import ROUTES, find
from .view import View, view_of


class CudaBackend(Backend):
    name = "cuda"
    map_route = "cuda.hash_map"
    neighbor_routes = ("cuda.knn", "cuda.radius")  # neighbors.knn, neighbors.radius

    fused_norm_switch = "FUSED_ON_CUDA"
    # MLX 0.32's CUDA quantized_matmul returns wrong values when a row holds
    # a single group and x has more than one row.
    quantized_matmul_single_group_exact = False
    quantized_products = False  # no CUDA route runs a QuantizedWeight
    tier_fixed = True

    def _probe(self) -> bool:
        cuda = getattr(mx, "cuda", None)
        return bool(cuda is not None and cuda.is_available())

    def table(self, coords, trusted=False):
        return maps.CudaTable(coords, trusted=trusted)

    def support(self, table, geometry, generative):
        fn = maps.generative_support if generative else maps.forward_support
        return fn(table, geometry)

    def relation(self, table, out_coords, geometry, transposed, kind, out_table=None):
        native, max_out, max_in, rows = find("cuda.hash_map", "map").run(
            table, out_coords, geometry, transposed, kind, onto_support=out_table is not None)
        return native, Plans(native, rows=rows), max_out, max_in

    def syncs(self):
        return maps.SYNCS

    def neighbor_queries(self):
        from . import neighbors  # loaded on the first query only

        return neighbors

    def fused_norm(self):
        from . import norm  # loaded on the first fused norm only

        return norm.norm_act_layer  # statistics without gradient: one output to differentiate

    def norm_running(self, x, weight, bias, residual, eps, act, slope, running_mean, running_var, keep, mu, ratio):
        from . import norm

        # the running statistics from the statistics' merge kernel
        return norm.norm_act_running(x, weight, bias, residual, eps, act, slope, running_mean, running_var,
                                     keep, mu, ratio)

    def running_stats(self, mean, var, batch_mean, batch_var, keep, mu, ratio):
        from . import norm

        return norm.running_stats(mean, var, batch_mean, batch_var, keep, mu, ratio)

    def adam_kernels(self):
        from . import adam  # loaded on the first optimizer step only

        return adam

    # The routes' kernels carry no autodiff: autodiff.py wraps them.
    differentiable_products = False

    def variants(self, route, c_in, c_out):
        return routes.variants(route, c_in, c_out)

    def product_view(self, relation):
        return None if relation is None else view_of(relation)

    def mapped_weight(self, weight):
        # Made contiguous once: a kernel given the transposed view copies it
        # at every launch (the forward product and the input gradient's),
        # and the weight gradient comes back in the parameter's own layout
        # (routes._reduce), so no copy follows it to the optimizer.
        return mx.contiguous(super().mapped_weight(weight))

    def flips_in_place(self, route, groups=1):
        # the ungrouped routes that stage W flipped (RouteEntry.flipped)
        entry = routes.ROUTES.get(route)
        both = groups == 1 and entry is not None and entry.flipped
        return (both, both)

    def launch(self, route, op, a, b, view, k=1, groups=1, variant=None, flip=(False, False)):
        from ... import routes as registry  # the registry imports the backends

        entry = find(route, op)
        grouped = registry.get(route).grouped
        if groups > 1 and not grouped:
            raise ValueError(f"a grouped product (groups={groups}) needs a grouped route, not {route}")
        args = (a, b, view) if op == "conv" else (a, b, view, k)
        if grouped:
            args += (groups,)
        kw = dict(variant or {})
        if any(flip):
            if not entry.flipped:
                raise ValueError(f"route {route} reads no flipped weight")
            kw["flip"] = tuple(flip)
        return entry.run(*args, **kw)

    def quantized_conv(self, route, x, weight, relation):
        raise ValueError(f"no CUDA route runs a QuantizedWeight (route {route})")


BACKEND = CudaBackend()
jit.set_kernel_finder(kernel_index.find)


def available() -> bool:
    return BACKEND.available()


__all__ = ["BACKEND", "ROUTES", "View", "available", "find", "sorted_mma_shared_bytes", "view_of"]
