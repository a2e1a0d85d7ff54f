"""The interface every backend implements, and the derived-array cache its
relations share.

A backend is one object (``mlx_lattice.backends.get(name)``): whether it can
run here and what its device can do (each computed once per process), how it
builds maps (coordinate tables, output supports, relations and everything a
layer reads from a relation), and how it runs the products of its route
table. Modules outside ``backends/`` ask :func:`mlx_lattice.backends.current`
which backend runs a call and talk to that object, asking its capabilities
(the attributes and methods below) rather than its name; none of them names
a backend's modules.

The CPU and Metal backends run through the C++ extension and share one
implementation (:class:`native.NativeBackend`); CUDA implements this
interface with kernels of its own (``backends/cuda``).
"""

from __future__ import annotations

import abc
import functools

import mlx.core as mx

from .. import _ext, layout


class Backend(abc.ABC):
    """One backend: ``cpu``, ``metal`` or ``cuda``."""

    name = ""
    map_route = ""  # the registry route that builds maps here
    neighbor_routes: tuple[str, ...] = ()  # the registry routes of its k-nearest and radius queries

    # ------------------------------------------------------------ capabilities
    # What callers outside backends/ ask instead of the backend's name.

    # Whether the products carry their own autodiff (the extension's
    # primitives, whose vjp and jvp run autodiff.py's rules); False: autodiff
    # wraps them in custom functions.
    differentiable_products = False
    # Which of mlx_lattice.nn.normalization's switches (FUSED_ON_CPU,
    # FUSED_ON_METAL, FUSED_ON_CUDA) turns this backend's fused norm on.
    fused_norm_switch = ""
    # Whether the extension's fused Adam primitives (_ext.adam_update,
    # _ext.adam_update_group) update parameters here.
    fused_adam_update = False
    # Whether MLX's scatter-add adds rows in row order here (segment sums
    # are then reproducible as they are; else summed in fixed pieces).
    scatter_add_in_row_order = False
    # Whether the extension's multithreaded column primitives (cat and fork
    # of feature columns) run here.
    native_column_ops = False
    # Whether the extension's patch attention kernel runs here (else MLX's
    # scaled_dot_product_attention with a key mask).
    native_patch_attention = False
    # Whether MLX's quantized_matmul is exact where a row holds a single
    # group (C_in == group_size) and x has several rows.
    quantized_matmul_single_group_exact = True
    # Whether a route of this backend runs a QuantizedWeight.
    quantized_products = True
    # Whether tier() and tensor_ops() are fixed for the process (a CPU's
    # tier follows its instruction-set path, Metal's facts can be refreshed).
    tier_fixed = False

    # ------------------------------------------------------------ the device
    @functools.cached_property
    def _available(self) -> bool:
        return self._probe()

    def available(self) -> bool:
        """Whether this backend can run here (asked once per process)."""
        return self._available

    @abc.abstractmethod
    def _probe(self) -> bool:
        """Whether the device and MLX's backend for it are here."""

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

    def tensor_ops(self) -> bool:
        """Whether this device and this build run the TensorOps routes."""
        return False

    def device_name(self) -> str:
        """The device's name, for tuning-cache keys (a GPU's by default)."""
        try:
            info = mx.device_info(mx.gpu)
        except Exception:
            return "unknown GPU"
        name = str(info.get("device_name", "unknown GPU"))
        arch = info.get("architecture")
        return f"{name} ({arch})" if arch else name

    def threads(self) -> int:
        """The host threads a product runs on, where a timing depends on
        them (0: it does not)."""
        return 0

    def stream(self):
        """The stream this backend's products run on."""
        return mx.default_stream(mx.default_device())

    # ------------------------------------------------------------ maps
    @abc.abstractmethod
    def table(self, coords: mx.array, trusted: bool = False):
        """The coordinate table of one set (validates range and uniqueness;
        ``trusted``: an output support, valid by construction)."""

    @abc.abstractmethod
    def support(self, table, geometry, generative: bool) -> mx.array:
        """Every output a strided (or generative transposed) convolution
        reaches, sorted by packed key."""

    @abc.abstractmethod
    def relation(self, table, out_coords, geometry, transposed: bool, kind: str, out_table=None):
        """(native relation, views, max output-row edges or None, max
        input-row edges or None): one relation, marked symmetric where it is
        (``_ext.symmetric_geometry`` onto the table's own rows), and the
        object its views are read from (:class:`Views`). ``out_table``: given only
        where ``out_coords`` is ``table``'s own forward support under this
        geometry (a strided layer's outputs), as that set's table."""

    def syncs(self) -> int | None:
        """Host synchronisations of map building so far (None: not counted)."""
        return 0

    @abc.abstractmethod
    def neighbor_queries(self):
        """A module of k-nearest and radius queries of this backend's own,
        ``knn(q, qb, p, pb, k)`` and ``radius(q, qb, p, pb, r,
        max_neighbors)`` returning ``(offsets, indices, distances)`` (None:
        the extension's serve it, ``_ext.knn_query`` / ``_ext.radius_query``)."""

    # ------------------------------------------------------------ layers
    def fused_norm_available(self) -> bool:
        """Whether this install runs the fused norm here."""
        return True

    @abc.abstractmethod
    def fused_norm(self):
        """The fused norm + activation (+ residual) the normalisation layers
        call on this backend (``_ext.norm_act``'s arguments and results; a
        backend may return a training call's statistics without gradient,
        since the layers read them only for their running statistics: the
        extension's then take no cotangents in the backward pass)."""

    @abc.abstractmethod
    def norm_running(self, x, weight, bias, residual, eps, act, slope, running_mean, running_var,
                     keep: float, mu: float, ratio: float):
        """A batch norm layer's training call with float32 (C,) running
        statistics: ``[y, new running mean, new running var]``, the fused
        norm then :meth:`running_stats`'s arithmetic."""

    @abc.abstractmethod
    def running_stats(self, mean, var, batch_mean, batch_var, keep: float, mu: float, ratio: float):
        """(keep * mean + mu * batch_mean, keep * var + mu * batch_var * ratio):
        a batch norm's float32 running statistics after a training call."""

    def adam_kernels(self):
        """A module of grouped Adam updates of this backend's own
        (``eligible(g, p, state)``, ``update(groups, scalars, b1, b2, eps,
        bias_correction, decoupled_decay)``), which an optimizer step runs
        eagerly (None: none)."""
        return None

    # ------------------------------------------------------------ products
    def variants(self, route: str, c_in: int, c_out: int) -> list[dict]:
        """The tile shapes of ``route`` the tuner may ask for (one: the
        route chooses its tiles itself)."""
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

    def flips_in_place(self, route: str, groups: int = 1) -> tuple:
        """(transposed, mirrored): which readings of a weight ``route``'s
        conv product with ``groups`` groups makes in place
        (``launch(..., flip=)``); autodiff.conv makes the others by MLX
        ops."""
        return (False, False)

    @abc.abstractmethod
    def launch(self, route: str, op: str, a, b, view, k: int = 1, groups: int = 1,
               variant: dict | None = None, flip: tuple = (False, False), shape=None):
        """One product by ``route``: ``conv`` (a through the weight b over
        ``view``, None: pointwise; b read with ``flip``, which holds only
        readings of :meth:`flips_in_place`) or ``weight_grad`` (a^T b per offset, K = k;
        in the parameter layout of ``shape`` where given and
        :meth:`reads_parameter`); ``variant``: the route's tile shapes."""

    @abc.abstractmethod
    def product_view(self, relation):
        """The view a product reads of ``relation`` (None: pointwise), for
        ``launch`` and autodiff (a :class:`ProductView`)."""

    @abc.abstractmethod
    def quantized_conv(self, route: str, x, weight, relation):
        """The product of a QuantizedWeight (inference: input gradients only)."""


def symmetric_onto_itself(table, out_coords, geometry, transposed: bool) -> bool:
    """Whether a GPU table's relation onto ``out_coords`` is symmetric: onto
    the table's own rows, by a geometry whose edges pair up (the predicate
    the CPU's builder applies, ``_ext.symmetric_geometry``)."""
    return out_coords is table.coords and _ext.symmetric_geometry(*geometry, transposed)


class ProductView:
    """What autodiff reads of the view a product runs over (every backend's
    views are these): its rows, its relation's kind, edges and symmetry,
    and the view with roles exchanged (``flipped``)."""

    relation = None  # the relation viewed (kind, edges, symmetric): a Relation or a native one

    @property
    def kind(self) -> str:
        return self.relation.kind

    @property
    def edges(self) -> int:
        return self.relation.edges

    @property
    def symmetric(self) -> bool:
        """Whether the relation is symmetric (``Relation.symmetric``): an
        input gradient then reads this view with the weight mirrored
        (autodiff.input_gradient_view)."""
        return self.relation.symmetric

    @property
    def rows(self) -> int:
        raise NotImplementedError

    def flipped(self) -> "ProductView":
        raise NotImplementedError


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
