"""The interface every backend implements, and the derived-array cache its
relations share.

A backend is one object (``mlx_lattice.backends.get(name)``): whether it can
run here and what its device can do (each computed once per process), how it
builds maps (coordinate tables, output supports, relations and everything a
layer reads from a relation), and how it runs the products of its route
table. Modules outside ``backends/`` ask :func:`mlx_lattice.backends.current`
which backend runs a call and talk to that object; none of them names a
backend's modules.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from .. import _ext, layout


class Backend:
    """One backend: ``cpu``, ``metal`` or ``cuda``."""

    name = ""
    map_route = ""  # the registry route that builds maps here
    neighbor_routes: tuple[str, ...] = ()  # the registry routes of its k-nearest and radius queries

    # ------------------------------------------------------------ the device
    @functools.cached_property
    def _available(self) -> bool:
        return self._probe()

    def available(self) -> bool:
        """Whether this backend can run here (asked once per process)."""
        return self._available

    def _probe(self) -> bool:
        raise NotImplementedError

    def unusable_reason(self) -> str | None:
        """Why a call on this backend must run on the CPU instead: the device
        is there but this install cannot drive it (None: it can)."""
        return None

    def capabilities(self) -> dict:
        """What the device can do (computed once per process)."""
        return {}

    def tier(self) -> str:
        """A short description of the device's capabilities, for route
        records and tuning-cache keys."""
        return self.name

    def stream(self):
        """The stream this backend's products run on."""
        return mx.default_stream(mx.default_device())

    # ------------------------------------------------------------ maps
    def table(self, coords: mx.array, trusted: bool = False):
        """The coordinate table of one set (validates range and uniqueness;
        ``trusted``: an output support, valid by construction)."""
        raise NotImplementedError

    def support(self, table, geometry, generative: bool) -> mx.array:
        """Every output a strided (or generative transposed) convolution
        reaches, sorted by packed key."""
        raise NotImplementedError

    def relation(self, table, out_coords, geometry, transposed: bool, kind: str, out_table=None):
        """(native relation, views, max output-row edges or None, max
        input-row edges or None, symmetric): one relation and the object
        its views are read from (:class:`Views`). ``out_table``: given only
        where ``out_coords`` is ``table``'s own forward support under this
        geometry (a strided layer's outputs), as that set's table."""
        raise NotImplementedError

    def syncs(self) -> int | None:
        """Host synchronisations of map building so far (None: not counted)."""
        return 0

    def neighbor_queries(self):
        """A module of k-nearest and radius queries of this backend's own,
        ``knn(q, qb, p, pb, k)`` and ``radius(q, qb, p, pb, r,
        max_neighbors)`` returning ``(offsets, indices, distances)`` (None:
        the extension's serve it, ``_ext.knn_query`` / ``_ext.radius_query``)."""
        return None

    def fused_norm(self):
        """The fused norm + activation (+ residual) the normalisation layers
        call on this backend (``_ext.norm_act``'s arguments and results; a
        backend may return a training call's statistics without gradient,
        since the layers read them only for their running statistics: the
        extension's then take no cotangents in the backward pass)."""
        return _layer_norm_act

    def norm_running(self, x, weight, bias, residual, eps, act, slope, running_mean, running_var,
                     keep: float, mu: float, ratio: float):
        """A batch norm layer's training call with float32 (C,) running
        statistics: ``[y, new running mean, new running var]``, the fused
        norm then :meth:`running_stats`'s arithmetic (``_ext.norm_act_running``:
        one primitive on the CPU, with the same bits; the two on Metal)."""
        return _ext.norm_act_running(x, weight, bias, residual, eps, act, slope, running_mean, running_var,
                                     keep, mu, ratio)

    def running_stats(self, mean, var, batch_mean, batch_var, keep: float, mu: float, ratio: float):
        """(keep * mean + mu * batch_mean, keep * var + mu * batch_var * ratio):
        a batch norm's float32 running statistics after a training call
        (``_ext.running_stats``: one primitive on the CPU, MLX's ops on
        other streams)."""
        return _ext.running_stats(mean, var, batch_mean, batch_var, keep, mu, ratio)

    # ------------------------------------------------------------ products
    # The products are the extension's primitives (GatherConv, WeightGrad:
    # src/core/primitives.h), whose own vjp and jvp run autodiff.py's rules;
    # a backend launching kernels without autodiff (CUDA) sets False, and
    # autodiff wraps its products in custom functions.
    differentiable_products = True

    def variants(self, route: str, c_in: int, c_out: int) -> list[dict]:
        """The tile shapes of ``route`` the tuner may ask for; the CPU and
        Metal routes choose their tiles inside the extension: none."""
        return [{}]

    def mapped_weight(self, weight: mx.array) -> mx.array:
        """A parameter (C_out, Kx, Ky, Kz, C_in) or (C_out, C_in) as the
        kernel-major (K, C_in, C_out) products read: a transposed view,
        which the extension's kernels read through its strides."""
        return layout.mapped_weight(weight)

    def product_weight(self, weight: mx.array) -> mx.array:
        """The weight a layer's product takes: kernel-major
        (:meth:`mapped_weight`), or the parameter itself where this
        backend's routes read it in place (:meth:`reads_parameter`)."""
        return self.mapped_weight(weight)

    def reads_parameter(self, route: str) -> bool:
        """Whether ``route`` reads a weight in the parameter's layout in
        place, and writes weight gradients in it (``layout``)."""
        return False

    def reads_flipped(self, route: str) -> bool:
        """Whether ``route``'s conv product reads a weight transposed and / or
        mirrored in place (``launch(..., flip=)``; autodiff.conv); the
        Metal routes take the flipped weight made by MLX ops."""
        return False

    # The CPU and Metal products are primitives of the extension (GatherConv,
    # WeightGrad, QuantizedConv: src/core/primitives.h) that run the route's
    # table entry; their autodiff is mlx_lattice/autodiff.py's.
    def launch(self, route: str, op: str, a, b, view, k: int = 1, groups: int = 1,
               variant: dict | None = None, flip: tuple = (False, False), shape=None):
        """One product by ``route``: ``conv`` (a through the weight b over
        ``view``, None: pointwise; b read with ``flip`` where
        :meth:`reads_flipped`) or ``weight_grad`` (a^T b per offset, K = k;
        in the parameter layout of ``shape`` where given and
        :meth:`reads_parameter`); ``variant``: the route's tile shapes."""
        native = None if view is None else view.native
        major = _ext.View.output_major if view is None else view.major
        symmetric = view is not None and view.symmetric
        if op == "conv":
            return _ext.gather_conv(a, b, native, major, route, self.stream(), groups=groups,
                                    flip=tuple(flip), symmetric=symmetric)
        return _ext.weight_grad(a, b, native, major, k, route, self.stream(), groups=groups,
                                symmetric=symmetric, shape=None if shape is None else list(shape))

    def product_view(self, relation):
        """The view a product reads of ``relation`` (None: pointwise), for
        ``launch`` and autodiff."""
        return None if relation is None else NativeView(relation._native, _ext.View.output_major,
                                                        relation.symmetric)

    def native_view(self, native, major, symmetric: bool):
        """The view of a native relation read ``major`` (a primitive's own,
        for its autodiff rules)."""
        return NativeView(native, major, symmetric)

    def quantized_conv(self, route: str, x, weight, relation):
        """The product of a QuantizedWeight (inference: input gradients only)."""
        codes, scales, biases = weight.kernel_major()
        native = None if relation is None else relation._native
        return _ext.quantized_conv(x, codes, scales, biases, weight.bits, weight.group_size, native,
                                   _ext.View.output_major, route, self.stream())


def _layer_norm_act(*args):
    """``_ext.norm_act`` for the layers: a training call's statistics
    without gradient."""
    return _ext.norm_act(*args, stats_grad=False)


class ProductView:
    """What autodiff reads of the view a product runs over (every backend's
    views are these): its rows, its relation's kind, edges and symmetry,
    and the view with roles exchanged (``flipped``)."""

    relation = None  # the mlx_lattice.relation.Relation viewed

    @property
    def kind(self) -> str:
        return self.relation.kind

    @property
    def edges(self) -> int:
        return self.relation.edges

    @property
    def symmetric(self) -> bool:
        """Whether an input gradient may run on this view with the offsets
        mirrored (``Relation.symmetric``) rather than on the flipped view."""
        return self.relation.symmetric

    @property
    def rows(self) -> int:
        raise NotImplementedError

    def flipped(self) -> "ProductView":
        raise NotImplementedError


class NativeView(ProductView):
    """A CSR view of a relation for the extension's products: the native
    relation's maps read output-major (rows are its outputs) or input-major,
    and whether the relation is symmetric (``Relation.symmetric``)."""

    def __init__(self, native, major=_ext.View.output_major, symmetric: bool = False):
        self.native, self.major, self._symmetric = native, major, symmetric

    @property
    def kind(self) -> str:
        return self.native.kind

    @property
    def edges(self) -> int:
        return self.native.edges

    @property
    def symmetric(self) -> bool:
        return self._symmetric

    @property
    def rows(self) -> int:
        out = self.major == _ext.View.output_major
        return self.native.n_out if out else self.native.n_in

    def flipped(self) -> "NativeView":
        out = self.major == _ext.View.output_major
        return NativeView(self.native, _ext.View.input_major if out else _ext.View.output_major,
                          self._symmetric)


class Views:
    """The derived arrays of one relation (``out_idx``, the kernel-major and
    input-major views, the sorted plan, the relation with roles exchanged),
    each made on first use and kept. Every backend's relations read their
    views through an object with these methods; a backend whose native
    relation derives them itself (CPU) or carries them attached (Metal)
    answers from it."""

    def __init__(self, native):
        self.native = native
        self._cache = {}

    def _once(self, name, build):
        if name not in self._cache:
            self._cache[name] = build()
        return self._cache[name]

    def out_idx(self) -> mx.array:
        return self.native.out_idx

    def kernel_major(self) -> tuple:
        return self.native.kernel_major()

    def input_major(self) -> tuple:
        return self.native.input_major()

    def sorted_plan(self) -> tuple:
        return self.native.sorted_plan()

    def swapped(self, kind: str, geometry):
        """(native relation with roles exchanged, labelled ``kind``, its Views)."""
        native = self.native.swapped(kind)
        return native, type(self)(native)
