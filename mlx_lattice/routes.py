"""The route registry: every route (convolution products, map building,
neighbour queries) with its backend, predicate and priority. Dispatch builds
a :class:`RouteContext` with :func:`context` and asks :func:`choose`, which
selects and records the route; selection itself (:func:`select`) is a pure
function of the context, so any machine can ask which route another would
take.

This module holds the route type, the registry and selection; each backend
registers its own routes (``mlx_lattice/backends/<backend>_routes.py``,
conditions several share in ``route_conditions``), which the package loads
first on import (``mlx_lattice/__init__.py``), in the order cpu, metal, cuda. Each route name is a key
of its backend's table: ``src/cpu/routes.cpp``, ``src/metal/<family>.cpp``
(beside ``metal/<family>.metal``) and ``mlx_lattice/backends/cuda/routes.py``
(map building and neighbour queries: each backend's ``map_route`` and
``neighbor_routes``); a test keeps the tables and this registry naming the
same routes.

``python -m mlx_lattice routes --markdown`` prints docs/routes.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple


from . import backends, diagnostics

BACKENDS = backends.NAMES
DIRECTIONS = ("forward", "dgrad", "wgrad")
# The passes of the neighbour queries (mlx_lattice/neighbors.py): a query's
# context has op and direction both "knn" or "radius".
NEIGHBOR_PASSES = diagnostics.NEIGHBOR_OPS


class _ContextFields(NamedTuple):
    op: str
    map_kind: str
    dtype: str
    backend: str
    kernel_size: tuple[int, int, int] | None
    stride: tuple[int, int, int] = (1, 1, 1)
    padding: tuple[int, int, int] = (0, 0, 0)
    dilation: tuple[int, int, int] = (1, 1, 1)
    explicit_target: bool = False
    c_in: int = 1
    c_out: int = 1
    n_in: int = 0
    n_out: int = 0
    edges: int = 0
    coord_dtype: str = "int32"
    quantized: bool = False
    weight_layout: str = "dense5d"
    tier: str = "cpu"
    tensor_ops: bool = False  # Metal 4 TensorOps (neural accelerators) available
    direction: str = "forward"  # forward, dgrad (input gradient), wgrad; knn or radius (neighbour queries)
    # kernel volume, derived from kernel_size when 0; a neighbour query's
    # neighbours wanted (knn: k; radius: max_neighbors, 0 for all)
    k: int = 0
    group_size: int = 0  # quantized weights: input channels per scale/bias
    groups: int = 1  # channel groups (grouped / depthwise convolution)
    # Neighbour queries (n_in: reference points, n_out: queries): the radius
    # (0: k nearest), the largest point batch index + 1, and the largest
    # coordinate magnitude of queries and points.
    radius: float = 0.0
    batches: int = 0
    coord_max: float = 0.0


class RouteContext(_ContextFields):
    """The checklist of a convolution call, as route predicates see it:
    immutable and hashable (the route memo's key). A named tuple: a network
    makes one for every product of every step, and a frozen dataclass took
    five times as long to build and twice as long to hash."""

    __slots__ = ()

    def __new__(cls, *args, **fields):
        self = _ContextFields.__new__(cls, *args, **fields)
        if self.k == 0 and self.kernel_size is not None:
            self = self._replace(k=_volume(self.kernel_size))
        return self

    def as_dict(self) -> dict:
        return self._asdict()


_CONTEXT_FIELDS = RouteContext._fields


def _volume(kernel_size) -> int:
    """K, a context's kernel volume, where it is derived from the kernel size."""
    a, b, c = kernel_size
    return a * b * c


@dataclass(frozen=True)
class Condition:
    text: str
    test: Callable[[RouteContext], bool]
    # The context fields the test reads (derived from its code when not
    # given): a failed condition names their values.
    reads: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.reads:
            object.__setattr__(self, "reads", _fields_read(self.test))

    def unmet(self, ctx: RouteContext) -> str:
        """What a context that fails this condition is told: the requirement,
        said to be unmet, and the values of the fields it read."""
        values = ", ".join(f"{f}={getattr(ctx, f)}" for f in self.reads)
        return f"requires {self.text}, not met: {values or 'this call'}"


def _fields_read(fn) -> tuple[str, ...]:
    """The RouteContext fields a predicate's code names (its own code and
    any code nested in it), in the order they appear."""
    names, stack = [], [getattr(fn, "__code__", None)]
    while stack:
        code = stack.pop()
        if code is None:
            continue
        names += [n for n in code.co_names if n in _CONTEXT_FIELDS and n not in names]
        stack += [c for c in code.co_consts if hasattr(c, "co_names")]
    return tuple(names)


@dataclass(frozen=True)
class Route:
    name: str
    backend: str
    priority: int
    conditions: tuple[Condition, ...]
    passes: tuple[str, ...] = ("forward",)
    uses_relation: bool = True
    deterministic: bool = True
    grouped: bool = False  # serves groups > 1 (and only those)
    kernel_file: str = ""
    summary: str = ""
    matrix_unit: bool = False  # multiplies on simdgroup matrices or TensorOps (Metal)

    @property
    def table_file(self) -> str:
        """Where the route's table entry is: the host code that launches it
        (as its backend's route module says)."""
        return _TABLE_FILE[self.backend](self)

    @property
    def predicate(self) -> str:
        texts = [GROUPED_TEXT] if self.grouped else []
        texts += [c.text for c in self.conditions]
        query = set(self.passes) <= set(NEIGHBOR_PASSES)
        return " and ".join(texts) or ("any query" if query else "any valid relation")

    def _unmet(self, ctx: RouteContext):
        """None when the route applies to ctx; else the reason (text) or
        the first condition ctx fails."""
        if ctx.backend != self.backend:
            return f"backend is {ctx.backend}, route needs {self.backend}"
        if ctx.direction not in self.passes:
            return f"route serves {'/'.join(self.passes)}, not {ctx.direction}"
        if (ctx.groups > 1) != self.grouped:
            return _GROUPED if self.grouped else _UNGROUPED
        for c in self.conditions:
            if not c.test(ctx):
                return c
        return None

    def applies(self, ctx: RouteContext) -> bool:
        return self._unmet(ctx) is None

    def failed(self, ctx: RouteContext) -> str | None:
        """Why the route does not apply to ctx, or None when it does: the
        backend or pass it lacks, or the first condition ctx fails, said to
        be unmet with the values it read (``requires K == 27, not met:
        k=8``)."""
        why = self._unmet(ctx)
        return why if why is None or isinstance(why, str) else why.unmet(ctx)


# Grouped routes serve exactly the calls with groups > 1; every other route
# exactly those with groups == 1 (checked in Route._unmet, before conditions).
GROUPED_TEXT = "groups > 1 (grouped or depthwise)"
_GROUPED = Condition(GROUPED_TEXT, lambda c: c.groups > 1)
_UNGROUPED = Condition("groups == 1 (grouped products take a grouped route)", lambda c: c.groups == 1)


class Selection:
    """A context's route, why the others were passed over (``rejected``,
    fresh records built when first read: a network asks for a route on every
    product of every step, and with a new sample's sizes every context is
    new), any fallback and the tuner's tile shapes."""

    __slots__ = ("route", "fallback", "variant", "_rejected", "_ctx")

    def __init__(self, route: Route, rejected: list | None = None, fallback: str | None = None,
                 variant: dict | None = None, ctx: RouteContext | None = None):
        self.route, self.fallback, self.variant = route, fallback, variant
        self._rejected, self._ctx = rejected, ctx

    @property
    def rejected(self) -> list:
        if self._rejected is None:
            self._rejected = [] if self._ctx is None else [dict(r) for r in _rejections(self._ctx)]
        return self._rejected

    def __repr__(self) -> str:
        return f"Selection(route={self.route.name!r}, fallback={self.fallback!r}, variant={self.variant!r})"


_REGISTRY: dict[str, Route] = {}
# select() by context: a route's predicate is a function of the context alone,
# and a network asks the same few contexts on every step (forward and both
# autodiff products of each layer). Emptied when a route is registered, and
# when full: contexts hold sizes (rows, edges), so data whose sizes change
# every step would otherwise grow it without bound.
_SELECTED: dict[RouteContext, tuple[Route, str | None]] = {}
_SELECTED_MAX = 4096
# Their rejection records, made when a caller reads them (diagnostics).
_REJECTED: dict[RouteContext, tuple] = {}


# Where each backend's routes have their table entries (Route.table_file):
# given by the module that registers them.
_TABLE_FILE: dict[str, Callable[[Route], str]] = {}


def register_table_file(backend: str, where: Callable[[Route], str]) -> None:
    """Say where the table entries of ``backend``'s routes are."""
    _TABLE_FILE[backend] = where


def register(route: Route) -> Route:
    if route.name in _REGISTRY:
        raise ValueError(f"route {route.name!r} is already registered")
    if route.backend not in BACKENDS:
        raise ValueError(f"unknown backend {route.backend!r}")
    _REGISTRY[route.name] = route
    _SELECTED.clear()
    _REJECTED.clear()
    return route


def get(name: str) -> Route:
    return _REGISTRY[name]


def list_routes() -> list[dict]:
    """Every registered route: name, backend, priority and predicate text."""
    return [
        {
            "name": r.name,
            "backend": r.backend,
            "priority": r.priority,
            "passes": list(r.passes),
            "predicate": r.predicate,
            "deterministic": r.deterministic,
            "kernel_file": r.kernel_file,
            "table_file": r.table_file,
            "matrix_unit": r.matrix_unit,
            "summary": r.summary,
        }
        for r in sorted(_REGISTRY.values(), key=lambda r: (BACKENDS.index(r.backend), -r.priority))
    ]


# The routes, highest priority first (registration order among equals):
# all of them (None) and each backend's, rebuilt when the registry changes.
_ORDER: tuple = (None, 0, {})


def _ordered(backend: str | None) -> tuple[Route, ...]:
    global _ORDER
    registry, size, by_backend = _ORDER
    if registry is not _REGISTRY or size != len(_REGISTRY):
        ranked = tuple(sorted(_REGISTRY.values(), key=lambda r: -r.priority))
        by_backend = {b: tuple(r for r in ranked if r.backend == b) for b in BACKENDS}
        by_backend[None] = ranked
        _ORDER = (_REGISTRY, len(_REGISTRY), by_backend)
    return by_backend[backend]


def _pick(ctx: RouteContext) -> Route | None:
    for r in _ordered(ctx.backend):
        if r._unmet(ctx) is None:
            return r
    return None


def _reasons(ctx: RouteContext, chosen: Route | None) -> list:
    """Every route but ``chosen``, with why it was not taken on ctx."""
    out = []
    for r in _ordered(None):
        if r is not chosen:
            out.append({"route": r.name, "reason": r.failed(ctx) or f"lower priority than {chosen.name}"})
    return out


def select(ctx: RouteContext) -> Selection:
    """The highest-priority route of ctx.backend whose predicate holds.

    When no route of a GPU backend applies, the CPU routes are asked and the
    selection says so in ``fallback``; nothing falls back silently.
    """
    chosen, fallback = _cached(ctx)
    return Selection(chosen, None, fallback, ctx=ctx)


def _cached(ctx: RouteContext) -> tuple[Route, str | None]:
    hit = _SELECTED.get(ctx)
    if hit is None:
        if len(_SELECTED) >= _SELECTED_MAX:
            _SELECTED.clear()
        chosen, _, fallback = _select(ctx, reasons=False)
        hit = _SELECTED[ctx] = (chosen, fallback)
    return hit


def _select(ctx: RouteContext, reasons: bool = True) -> tuple[Route, tuple, str | None]:
    """(route, rejection records, fallback) of ctx; the records only when
    ``reasons`` (they name every registered route)."""
    chosen = _pick(ctx)
    if chosen is not None:
        return chosen, tuple(_reasons(ctx, chosen)) if reasons else (), None
    cpu = backends.CPU.name  # the backend every call can fall back to
    if ctx.backend != cpu:
        cpu_ctx = RouteContext(**{**ctx.as_dict(), "backend": cpu, "tier": cpu})
        chosen = _pick(cpu_ctx)
        if chosen is not None:
            note = f"no {ctx.backend} route accepts this call; running on the CPU"
            # the GPU context's records: why no route of its backend applied
            return chosen, tuple(_reasons(ctx, None)) if reasons else (), note
    raise ValueError(f"no route accepts {ctx}")


def _rejections(ctx: RouteContext) -> tuple:
    """ctx's rejection records (shared; Selection.rejected copies them)."""
    hit = _REJECTED.get(ctx)
    if hit is None:
        if len(_REJECTED) >= _SELECTED_MAX:
            _REJECTED.clear()
        hit = _REJECTED[ctx] = _select(ctx)[1]
    return hit


def context(op: str, backend: str, **fields) -> RouteContext:
    """The RouteContext of a call on `backend`: the one place that derives the
    capability tier and whether TensorOps kernels can run (the GPU's tier and
    this build's Metal 4 library)."""
    caps = _CAPS.get(backend)
    if caps is None:
        device = backends.get(backend)
        caps = (device.tier(), bool(device.tensor_ops()))
        if device.tier_fixed:  # asked once (a CPU's follows its instruction-set path)
            _CAPS[backend] = caps
    ks = fields.get("kernel_size")
    if ks is not None and not fields.get("k"):
        fields["k"] = _volume(ks)
    # RouteContext's own __new__ (which derives k) costs a repacking of the
    # arguments: this is the call a network makes for every product
    return _new_context(RouteContext, op=op, backend=backend, tier=caps[0], tensor_ops=caps[1], **fields)


_new_context = _ContextFields.__new__


# (tier, tensor_ops) of a backend whose tier is fixed for the process (CUDA's),
# asked once.
_CAPS: dict = {}


# The route tuner (mlx_lattice/tuning.py) installs itself here: given the
# context, the static selection and the call's data (a probe, or None where
# the call has none at hand), it returns the selection to run and the fields
# its record gets (where the choice came from, the timings measured).
_choice_hook: Callable | None = None


def set_choice_hook(hook: Callable | None) -> None:
    global _choice_hook
    _choice_hook = hook


def choose(ctx: RouteContext, fallback: str | None = None, probe=None) -> Selection:
    """Select ctx's route and record the choice (with the rejected routes and
    any fallback) in the diagnostics log. ``fallback``: why the call already
    left its device (backends.executing: a GPU without this build's
    kernels). The static selection goes through the route tuner, which may
    take another eligible route (a cached or measured choice, or one named
    explicitly); ``probe``: the call's data, for the tuner to measure on."""
    chosen, static_fallback = _cached(ctx)
    sel = Selection(chosen, None, static_fallback, ctx=ctx)
    tuned = None
    if _choice_hook is not None:
        sel, tuned = _choice_hook(ctx, sel, probe)
    if diagnostics.listening():
        # The record is built only for a listener: a network asks this for
        # every product of every step.
        entry = ctx.as_dict()
        entry.update(
            route=sel.route.name, backend=sel.route.backend, rejected=[dict(r) for r in sel.rejected],
            fallback=fallback or sel.fallback, deterministic=sel.route.deterministic,
        )
        if tuned:
            entry.update(tuned)
        diagnostics.emit(entry)
    return sel


def markdown() -> str:
    lines = [
        "# Routes",
        "",
        "Generated from the registry in `mlx_lattice/routes.py` by"
        " `python -m mlx_lattice routes --markdown > docs/routes.md`;"
        " a test keeps this file equal to the registry.",
        "",
        "Convolution products (passes forward, dgrad, wgrad), map building (map) and"
        " neighbour queries (knn, radius, docs/neighbors.md).",
        "Within a backend the highest-priority route whose predicate holds is taken;"
        " where no route of a GPU backend holds, the CPU's runs, on record.",
        "",
        "| route | backend | passes | priority | predicate | deterministic | table entry | kernels | what it does |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in list_routes():
        lines.append(
            f"| `{r['name']}` | {r['backend']} | {', '.join(r['passes'])} | {r['priority']} | {r['predicate']} | "
            f"{'yes' if r['deterministic'] else 'no (atomics)'} | `{r['table_file']}` | `{r['kernel_file']}` | "
            f"{r['summary']} |"
        )
    return "\n".join(lines) + "\n"

