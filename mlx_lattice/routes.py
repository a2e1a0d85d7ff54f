"""The route registry: every route (convolution products, map building,
neighbour queries) with its backend, predicate and priority. Dispatch builds
a :class:`RouteContext` with :func:`context` and asks :func:`choose`, which
selects and records the route; selection itself (:func:`select`) is a pure
function of the context, so any machine can ask which route another would
take.

Each route name is a key of its backend's table: ``src/cpu/routes.cpp``,
``src/metal/<family>.cpp`` (beside ``metal/<family>.metal``) and
``mlx_lattice/backends/cuda/routes.py`` (map building and neighbour queries:
each backend's ``map_route`` and ``neighbor_routes``); a test keeps the
tables and this registry naming the same routes.

``python -m mlx_lattice routes --markdown`` prints docs/routes.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple


from . import _ext, backends, diagnostics

BACKENDS = ("cpu", "metal", "cuda")
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
        """Where the route's table entry is: the host code that launches it."""
        if self.backend == "metal":
            return "src/metal/" + self.kernel_file.split("/")[-1].replace(".metal", ".cpp")
        if self.passes == ("map",) and self.backend == "cpu":
            return "mlx_lattice/backends/cpu.py"
        if set(self.passes) <= set(NEIGHBOR_PASSES):  # the backend's neighbor_routes
            return "mlx_lattice/backends/" + ("cpu.py" if self.backend == "cpu" else "cuda/__init__.py")
        if self.backend == "cpu":
            return "src/cpu/routes.cpp"
        return "mlx_lattice/backends/cuda/routes.py"

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
    if ctx.backend != "cpu":
        cpu_ctx = RouteContext(**{**ctx.as_dict(), "backend": "cpu", "tier": "cpu"})
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
        caps = (device.tier(), bool(backend == "metal" and device.tensor_ops()))
        if backend == "cuda":  # fixed for the process (a CPU's follows its instruction-set path)
            _CAPS[backend] = caps
    ks = fields.get("kernel_size")
    if ks is not None and not fields.get("k"):
        fields["k"] = _volume(ks)
    # RouteContext's own __new__ (which derives k) costs a repacking of the
    # arguments: this is the call a network makes for every product
    return _new_context(RouteContext, op=op, backend=backend, tier=caps[0], tensor_ops=caps[1], **fields)


_new_context = _ContextFields.__new__


# (tier, tensor_ops) of the CUDA backend, asked once.
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


# ------------------------------------------------------------------ helpers
def _cond(text, test):
    return Condition(text, test)


KERNEL_1 = _cond("kernel 1x1x1", lambda c: c.kernel_size == (1, 1, 1))
STRIDE_1 = _cond("stride 1", lambda c: c.stride == (1, 1, 1))
NO_PAD_DIL = _cond(
    "no padding/dilation", lambda c: c.padding == (0, 0, 0) and c.dilation == (1, 1, 1)
)
NO_TARGET = _cond("no explicit target support", lambda c: not c.explicit_target)
FORWARD_KIND = _cond(
    "map kind forward or submanifold", lambda c: c.map_kind in ("forward", "submanifold")
)
DENSE = _cond("dense (unquantized) weight", lambda c: not c.quantized)
METAL_DTYPES = _cond("features float32 or float16", lambda c: c.dtype in ("float32", "float16"))

SORTED_KIND = _cond(
    "map kind forward, target or submanifold",
    lambda c: c.map_kind in ("forward", "target", "submanifold"),
)
FP16 = _cond("features float16", lambda c: c.dtype == "float16")
FP32 = _cond("features float32", lambda c: c.dtype == "float32")
K27 = _cond("K == 27", lambda c: c.k == 27)
SQUARE_32_64 = _cond("C_in == C_out in {32, 64}", lambda c: c.c_in == c.c_out and c.c_in in (32, 64))
DENSE_LAYOUT = _cond("5D dense weight", lambda c: c.weight_layout == "dense5d")
CHANNELS_16_64 = _cond(
    "C_in and C_out in {16, 32, 64}", lambda c: c.c_in in (16, 32, 64) and c.c_out in (16, 32, 64)
)
K_GE_16 = _cond("K >= 16", lambda c: c.k >= 16)
CAP_4096 = _cond("output capacity >= 4096", lambda c: c.n_out >= 4096)
COUT16 = _cond(
    "C_out == 16 and (K >= 16 and output capacity >= 4096, or output capacity >= 50000)",
    lambda c: c.c_out == 16 and ((c.k >= 16 and c.n_out >= 4096) or c.n_out >= 50000),
)
COUT_DIV4 = _cond("C_out divisible by 4", lambda c: c.c_out % 4 == 0)

# ------------------------------------------------------------------ CPU routes
register(Route(
    name="cpu.pointwise", backend="cpu", priority=100,
    conditions=(DENSE, KERNEL_1, STRIDE_1, NO_PAD_DIL, NO_TARGET, FORWARD_KIND),
    passes=("forward", "dgrad"), uses_relation=False, kernel_file="src/cpu/gather_conv.cpp",
    summary="x.feats @ W[0] in the blocked GEMM kernel; keeps the input coordinates; no relation built",
))
register(Route(
    name="cpu.gather_gemm", backend="cpu", priority=0, conditions=(DENSE,),
    passes=("forward", "dgrad"), kernel_file="src/cpu/gather_conv.cpp",
    summary="blocked gather-GEMM: per block of output rows, edges by offset (from the "
    "relation's offset groups, made once per view), "
    "SIMD register tiles, float32 accumulation (in the float32 output itself where "
    "edges per row x C_in <= 200); weight panels packed through W's strides",
))
# Narrow inputs whose weight panel (K x C_in x C_out, C_out padded to 16)
# fits in 32 KiB of L1: a network's stem (C_in <= 8), and 16-channel strided
# layers (K <= 8: one or two edges per row), whose products are too short
# for the grouping by offset to pay off.
ROW_MAJOR_NARROW = _cond(
    "(C_in <= 8, or C_in <= 16 and K <= 8) and K * C_in * round_up(C_out, 16) * 4 <= 32 KiB",
    lambda c: (c.c_in <= 8 or (c.c_in <= 16 and c.k <= 8))
    and c.k * c.c_in * -(-c.c_out // 16) * 16 * 4 <= 32 << 10,
)
register(Route(
    name="cpu.row_gather", backend="cpu", priority=10, conditions=(DENSE, ROW_MAJOR_NARROW),
    passes=("forward", "dgrad"), kernel_file="src/cpu/gather_conv.cpp",
    summary="the gather-GEMM's row-major traversal for narrow inputs: edges in the view's "
    "order, several rows' products in lockstep, each row summed in registers and written "
    "once (no grouping by offset); the same sums as cpu.gather_gemm, bit for bit",
))
register(Route(
    name="cpu.wgrad_gemm", backend="cpu", priority=0, conditions=(DENSE,),
    passes=("wgrad",), kernel_file="src/cpu/weight_grad.cpp",
    summary="per-offset GEMM over packed panels of gathered rows; chunks by output-row block (all offsets of a block together, >= 512 edges a chunk on average), reduced in block order; written in the (C_out, K, C_in) parameter order",
))

register(Route(
    name="cpu.quantized_gather_gemm", backend="cpu", priority=0,
    conditions=(_cond("quantized weight (QuantizedWeight)", lambda c: c.quantized),),
    kernel_file="src/cpu/gather_conv.cpp",
    summary="int4/int8 codes unpacked (scale * q + bias) into the blocked gather-GEMM's "
    "float32 weight panels; any relation, any feature dtype",
))

# ------------------------------------------------------------------ Metal routes
register(Route(
    name="metal.pointwise", backend="metal", matrix_unit=True, priority=100,
    conditions=(DENSE, KERNEL_1, STRIDE_1, NO_PAD_DIL, NO_TARGET, FORWARD_KIND, METAL_DTYPES),
    passes=("forward", "dgrad"), uses_relation=False, kernel_file="metal/forward_dense.metal",
    summary="GEMM x @ W[0] on simdgroup matrices, any C_in and C_out: 64 rows x 16, 32 or 64 "
    "output channels per threadgroup (4 simdgroups of 8x8 float fragments, each 32 rows, float "
    "accumulation), x and W[0] staged 32 input channels at a time through threadgroup memory "
    "with masked loads",
))
register(Route(
    name="metal.sorted_gemm", backend="metal", matrix_unit=True, priority=90,
    conditions=(DENSE, SORTED_KIND, FP16, K27, SQUARE_32_64),
    kernel_file="metal/sorted_gemm.metal",
    summary="direct sorted route: rows in neighbour-mask order, 64-row tiles, offsets skipped "
    "by tile mask, simdgroup 8x8 matrices, rows written back through reorder_rows",
))
TENSOR_OPS = _cond("TensorOps available (Metal 4 neural accelerators)", lambda c: c.tensor_ops)
register(Route(
    name="metal.tensorops_sorted", backend="metal", matrix_unit=True, priority=95,
    conditions=(DENSE, SORTED_KIND, FP16, K27, SQUARE_32_64, TENSOR_OPS),
    kernel_file="metal/tensorops_sorted.metal",
    summary="TensorOps sorted contraction on the sorted plan: row-stationary 64-row tiles, "
    "one MetalPerformancePrimitives matmul2d per offset in the tile mask over four "
    "simdgroups, float accumulator in a cooperative tensor, rows written back through "
    "reorder_rows",
))
register(Route(
    name="metal.dense_channel", backend="metal", matrix_unit=True, priority=80,
    conditions=(DENSE, DENSE_LAYOUT, CHANNELS_16_64, K_GE_16, CAP_4096, METAL_DTYPES),
    kernel_file="metal/forward_dense.metal",
    summary="neighbour-map traversal on simdgroup matrices, compile-time channel counts: 32 rows "
    "x C_out per threadgroup, consecutive in the relation's row order (rows sorted by their "
    "offset set, the sorted plan's reorder_rows, written back in place; 4 simdgroups of 8x8 "
    "float fragments, float accumulation); offsets "
    "in order, those no row of the tile has skipped; each offset's gathered rows (zeros where a "
    "row lacks it) and W[k] staged once through threadgroup memory",
))
register(Route(
    name="metal.cout16", backend="metal", matrix_unit=True, priority=70,
    conditions=(DENSE, COUT16, METAL_DTYPES), passes=("forward", "dgrad"),
    kernel_file="metal/csr_mma.metal",
    summary="C_out == 16 on the kernels of metal.csr_mma at their 16-channel column block: 32 "
    "rows of the view's row order x 16 output channels per threadgroup (4 simdgroups of 8x8 "
    "float fragments), rows' "
    "edges taken in offset rounds, any C_in staged 16 channels at a time with masked loads",
))
# The matrix-unit route: every dense float product the routes above do not
# take, in any dtype, ahead of the scalar routes below (the order's reason is
# in its summary).
METAL_ALL_DTYPES = _cond(
    "features float32, float16 or bfloat16", lambda c: c.dtype in ("float32", "float16", "bfloat16")
)
register(Route(
    name="metal.csr_mma", backend="metal", matrix_unit=True, priority=65,
    conditions=(DENSE, METAL_ALL_DTYPES), passes=("forward", "dgrad"),
    kernel_file="metal/csr_mma.metal",
    summary="implicit GEMM on simdgroup matrices over the CSR edges of either view, any C_in, "
    "C_out and K: 32 rows x 16-128 output channels per threadgroup, the rows consecutive in the "
    "view's row order (rows sorted by the set of offsets they have: Relation::row_order, the "
    "sorted plan's reorder_rows for the output-major view), so a block's rows mostly share "
    "their offsets (4 simdgroups of 8x8 float "
    "fragments, float accumulation); each round takes the smallest offset pending among the 32 "
    "rows (offsets absent from the block never visited) and stages their gathered rows and W[k], "
    "16 input channels at a time, through threadgroup memory with masked loads. Priority: below "
    "the seed routes, which move fewer bytes or pad fewer MACs per row where they apply (rows "
    "grouped by neighbour mask; compile-time channels, W[k] staged once per offset); above the "
    "scalar routes, which per row read each gathered x row once per 1-4 output channels (this: "
    "once per 16-128) and run its E x C_in x C_out MACs one lane at a time (this: on 8x8 "
    "matrices, channels padded to multiples of 8, rows to the block's rounds)",
))
# Its TensorOps twin where the GPU has them (Apple10, macOS >= 26.2): the
# same program with each staged slice's products on the neural accelerators.
register(Route(
    name="metal.tensorops_csr_mma", backend="metal", matrix_unit=True, priority=66,
    conditions=(DENSE, METAL_ALL_DTYPES, TENSOR_OPS), passes=("forward", "dgrad"),
    kernel_file="metal/tensorops_csr_mma.metal",
    summary="metal.csr_mma's program with TensorOps products, either view, any C_in, C_out "
    "and K: the same 32 rows of the view's row order x 16-128 output channels per threadgroup, "
    "the same rounds of the smallest offset pending among the 32 rows (metal/csr_rounds.h) and "
    "the same staging of their gathered rows and W[k] as float, 16 input channels at a time, "
    "through threadgroup memory with masked loads (metal/mma_tile.h); each staged slice "
    "multiplied by one matmul2d (32 x BN x 16, float accumulator in a cooperative tensor) over "
    "four simdgroups, the tile written once at the end (masked, through the row order). "
    "Against metal.csr_mma, its direct twin (the route on every GPU without TensorOps): the "
    "same reads of x and W per round (each gathered row once per column block, W[k]'s slice "
    "once per 32 rows) and the same padded MACs (channels to 16 and the block, rows to the "
    "block's rounds), run on the neural accelerators instead of as BN/4 simdgroup 8x8 "
    "multiply-accumulates per simdgroup and slice; staged rows without the 8x8 loads' bank "
    "padding; one "
    "extra pass of the 32 x BN float tile through threadgroup memory per threadgroup. "
    "Priority: just above metal.csr_mma; below every seed route, which moves fewer bytes or "
    "pads fewer MACs per row where it applies",
))
register(Route(
    name="metal.vec4", backend="metal", priority=60,
    conditions=(DENSE, FP32, COUT_DIV4), passes=("forward", "dgrad"),
    kernel_file="metal/forward_vector.metal",
    summary="one thread per (row, 4 output channels), float4 arithmetic",
))
register(Route(
    name="metal.fp16_gather", backend="metal", priority=50,
    conditions=(DENSE, FP16), passes=("forward", "dgrad"),
    kernel_file="metal/forward_vector.metal",
    summary="one simdgroup per row; each edge's input row staged in threadgroup memory",
))
register(Route(
    name="metal.fp32_atomic", backend="metal", priority=40,
    conditions=(DENSE, FP32), deterministic=False,
    kernel_file="metal/forward_vector.metal",
    summary="one thread per (edge, channel), float atomics into a zeroed output",
))
register(Route(
    name="metal.fetch_on_demand", backend="metal", priority=0,
    conditions=(DENSE, METAL_DTYPES), passes=("forward", "dgrad"),
    kernel_file="metal/fetch_on_demand.metal",
    summary="one thread per (row, output channel) over the CSR edges",
))
register(Route(
    name="metal.wgrad_direct", backend="metal", priority=0,
    conditions=(DENSE, METAL_DTYPES), passes=("wgrad",),
    kernel_file="metal/fetch_on_demand.metal",
    summary="one thread per weight element over the kernel-major edges",
))


# Backward routes. An autodiff context describes the product being computed:
# for the input gradient (dgrad), C_in/C_out are the product's channels (the
# convolution's C_out/C_in) and n_out its rows, i.e. the convolution's input
# capacity; for the weight gradient (wgrad), n_in is the input capacity.
DGRAD_CAP_4096 = _cond("input capacity >= 4096", lambda c: c.n_out >= 4096)
DGRAD_CAP_65536 = _cond("input capacity >= 65536", lambda c: c.n_out >= 65536)
DGRAD_CAP_32768 = _cond("input capacity >= 32768", lambda c: c.n_out >= 32768)
WGRAD_CAP_32768 = _cond("input capacity >= 32768", lambda c: c.n_in >= 32768)
C16_SQUARE = _cond("C_in == C_out == 16", lambda c: c.c_in == 16 and c.c_out == 16)
MAPPED_LAYOUT = _cond(
    "weight mapped to kernel-major (K, C_in, C_out) (dense 5D or mapped; not packed)",
    lambda c: c.weight_layout in ("dense5d", "mapped"),
)
SQUARE_16_64 = _cond(
    "C_in == C_out in {16, 32, 64}", lambda c: c.c_in == c.c_out and c.c_in in (16, 32, 64)
)
EDGES_4096 = _cond("edges >= 4096", lambda c: c.edges >= 4096)
COUT_16 = _cond("C_out == 16", lambda c: c.c_out == 16)
CHANNELS_DIV4 = _cond("C_in and C_out divisible by 4", lambda c: c.c_in % 4 == 0 and c.c_out % 4 == 0)

register(Route(
    name="metal.tensorops_dgrad", backend="metal", matrix_unit=True, priority=88,
    conditions=(DENSE, C16_SQUARE, K_GE_16, MAPPED_LAYOUT, DGRAD_CAP_32768, TENSOR_OPS, FP32),
    passes=("dgrad",), kernel_file="metal/tensorops_backward.metal",
    summary="TensorOps input-gradient contraction: 64 input rows per threadgroup, one "
    "matmul2d (64x16 by 16x16, float) per offset present in the tile, gathered through the "
    "input-major neighbour map; accumulator in a cooperative tensor",
))
register(Route(
    name="metal.dgrad_dense_grouped", backend="metal", matrix_unit=True, priority=86,
    conditions=(DENSE, DENSE_LAYOUT, CHANNELS_16_64, DGRAD_CAP_65536, METAL_DTYPES),
    passes=("dgrad",), kernel_file="metal/forward_dense.metal",
    summary="grouped dense-channel input gradient: as metal.dgrad_dense_channel in 64-row tiles "
    "(4 simdgroups of 32 rows x C_out/2), so every W[k] staged in threadgroup memory serves "
    "twice the rows; C_in 64 staged in two 32-channel slices where the tiles would pass 28 KiB",
))
register(Route(
    name="metal.dgrad_dense_channel", backend="metal", matrix_unit=True, priority=84,
    conditions=(DENSE, DENSE_LAYOUT, CHANNELS_16_64, DGRAD_CAP_4096, METAL_DTYPES),
    passes=("dgrad",), kernel_file="metal/forward_dense.metal",
    summary="dense-channel input gradient: the simdgroup-matrix kernels of metal.dense_channel "
    "(32 rows x C_out per threadgroup) over the input-major neighbour map (N_in, K), W "
    "transposed per offset; the rows tiled in the input-major row order (input rows sorted by "
    "their offset set)",
))
register(Route(
    name="metal.tensorops_wgrad", backend="metal", matrix_unit=True, priority=90,
    conditions=(DENSE, CHANNELS_16_64, K_GE_16, WGRAD_CAP_32768, TENSOR_OPS, METAL_DTYPES),
    passes=("wgrad",), kernel_file="metal/tensorops_backward.metal",
    summary="partitioned TensorOps contraction: threadgroup (p, k) sums x^T ct over 32-edge "
    "chunks p, p+P, ... of offset k with matmul2d into a float partial; a second kernel "
    "(metal/backward.metal) adds the P partials in order",
))
# The matrix-unit weight gradient: every dense product's, in any dtype (so a
# bfloat16 product on metal.csr_mma has its gradients on the GPU), ahead of
# the scalar wgrad_* routes below (the order's reason is in its summary).
register(Route(
    name="metal.wgrad_mma", backend="metal", matrix_unit=True, priority=50,
    conditions=(DENSE, METAL_ALL_DTYPES), passes=("wgrad",),
    kernel_file="metal/wgrad_mma.metal",
    summary="x^T ct on simdgroup matrices over the kernel-major edges, any C_in, C_out and K: a "
    "32 x 32 or 32 x 64 block of dW[k] per threadgroup (4 simdgroups of 8x8 float fragments), "
    "16-edge chunks of x rows (transposed) and ct rows staged through threadgroup memory with "
    "masked loads; P partitions of an offset's chunks (about 512 edges each, P fixed by the "
    "shapes) into float partials that wgrad_reduce (metal/backward.metal) adds in order, or dW "
    "directly when P is 1. Priority: below the TensorOps contraction; above the scalar wgrad_* "
    "routes, which read each edge's x and ct rows once per element block of 1-16 weights (this: "
    "once per 32 x 32-64 block) and run the E x C_in x C_out MACs one lane at a time (this: on "
    "8x8 matrices, channels and edges padded to multiples of 8)",
))
# Its TensorOps twin where the GPU has them (Apple10, macOS >= 26.2): the
# same program with the chunk products on the neural accelerators.
register(Route(
    name="metal.tensorops_wgrad_mma", backend="metal", matrix_unit=True, priority=55,
    conditions=(DENSE, METAL_ALL_DTYPES, TENSOR_OPS), passes=("wgrad",),
    kernel_file="metal/tensorops_wgrad_mma.metal",
    summary="metal.wgrad_mma's program with TensorOps products, any C_in, C_out and K: the same "
    "32 x 32 or 32 x 64 blocks of dW[k], 16-edge chunks, P partitions and ordered wgrad_reduce "
    "(metal/backward.metal); each chunk's x rows and ct rows staged through threadgroup memory "
    "(float32 and float16 as they are, bfloat16 as float) and multiplied by one matmul2d "
    "(32 x BN x 16, float accumulator in a cooperative tensor) over four simdgroups. Against "
    "metal.wgrad_mma, its direct twin (the route on every GPU without TensorOps): the same reads "
    "of x and ct per edge (once per output block / input block) and the same padded MACs "
    "(channels to the block, edges to 16), run on the neural accelerators instead of as "
    "BN/4 simdgroup 8x8 multiply-accumulates per simdgroup and chunk; half the staged bytes in "
    "float16; one extra pass of the 32 x BN float block through threadgroup memory per "
    "threadgroup. Priority: just above "
    "metal.wgrad_mma; below metal.tensorops_wgrad, whose compile-time 16-64 channel tiles cover "
    "a whole dW[k] per threadgroup with 32-edge chunks where it applies",
))
register(Route(
    name="metal.wgrad_dense_square", backend="metal", priority=40,
    conditions=(DENSE, SQUARE_16_64, EDGES_4096, METAL_DTYPES),
    passes=("wgrad",), kernel_file="metal/backward.metal",
    summary="one threadgroup per offset, compile-time channels; 32 edges of x and ct staged "
    "in threadgroup memory per step, each thread owning C*C/256 elements of dW[k]",
))
register(Route(
    name="metal.wgrad_cout16", backend="metal", priority=30,
    conditions=(DENSE, COUT_16, METAL_DTYPES),
    passes=("wgrad",), kernel_file="metal/backward.metal",
    summary="one thread per (offset, input channel) computing all 16 output channels",
))
register(Route(
    name="metal.wgrad_block4", backend="metal", priority=20,
    conditions=(DENSE, FP32, CHANNELS_DIV4),
    passes=("wgrad",), kernel_file="metal/backward.metal",
    summary="one thread per 4x4 block of dW[k], float4 loads, an outer product per edge",
))
register(Route(
    name="metal.wgrad_fp16", backend="metal", priority=10,
    conditions=(DENSE, FP16),
    passes=("wgrad",), kernel_file="metal/backward.metal",
    summary="a 32x8 block of dW[k] per threadgroup; 32 edges staged (as float) in "
    "threadgroup memory and shared by the block",
))


# Quantized routes (QuantizedWeight; inference). A QuantizedWeight's group
# size divides C_in, so its storage channels always equal the logical ones.
QUANTIZED = _cond("quantized weight (QuantizedWeight)", lambda c: c.quantized)
CHANNELS_32_64 = _cond(
    "C_in and C_out in {32, 64}", lambda c: c.c_in in (32, 64) and c.c_out in (32, 64)
)
GROUP_LE_CIN = _cond("group size <= C_in", lambda c: 0 < c.group_size <= c.c_in)
GROUP_EQ_CIN = _cond("group_size == C_in", lambda c: c.group_size == c.c_in)
TIER_KNOWN = _cond(
    "TensorOps tier not unavailable (GPU tier detected)", lambda c: "unknown" not in c.tier
)

register(Route(
    name="metal.tensorops_quantized", backend="metal", matrix_unit=True, priority=95,
    conditions=(QUANTIZED, SORTED_KIND, FP16, K27, CHANNELS_32_64, GROUP_EQ_CIN, TENSOR_OPS),
    kernel_file="metal/tensorops_quantized.metal",
    summary="TensorOps quantized contraction on the sorted plan: per offset in a 64-row "
    "tile's mask, W[k] dequantized into a temporary fp16 tile, one matmul2d over four "
    "simdgroups into a float cooperative tensor, rows written back through reorder_rows",
))
register(Route(
    name="metal.sorted_quantized", backend="metal", matrix_unit=True, priority=90,
    conditions=(QUANTIZED, SORTED_KIND, FP16, K27, CHANNELS_32_64, GROUP_LE_CIN, TIER_KNOWN),
    kernel_file="metal/quantized.metal",
    summary="sorted quantized implicit GEMM: the tiles and masks of the direct sorted route, "
    "W[k] dequantized into threadgroup memory 32 input channels at a time, simdgroup 8x8 "
    "matrices, rows written back through reorder_rows",
))
register(Route(
    name="metal.quantized_fetch_on_demand", backend="metal", priority=0,
    conditions=(QUANTIZED, METAL_ALL_DTYPES),
    kernel_file="metal/quantized.metal",
    summary="direct packed convolution, float32/float16/bfloat16 features x int4/int8 codes: one "
    "thread per (row, output channel) over the CSR edges, codes read in place and the "
    "affine reconstruction applied per group (s * sum x q + b * sum x)",
))


# ------------------------------------------------------------------ grouped routes
# Grouped / depthwise convolution (groups > 1): weight (K, C_in / groups, C_out).
register(Route(
    name="cpu.grouped_gather", backend="cpu", priority=0, conditions=(DENSE,), grouped=True,
    passes=("forward", "dgrad"), kernel_file="src/cpu/grouped_conv.cpp",
    summary="per row, per edge and per input channel of a group, one SIMD multiply-add across "
    "all output channels (the group's input spread over its outputs; the row itself when "
    "depthwise); float32 accumulation in edge order",
))
register(Route(
    name="cpu.grouped_wgrad", backend="cpu", priority=0, conditions=(DENSE,), grouped=True,
    passes=("wgrad",), kernel_file="src/cpu/grouped_conv.cpp",
    summary="per-offset 2048-edge chunks of per-group outer products into float32 partials, "
    "added in chunk order",
))
# Grouped products on matrix units: metal.csr_mma's and metal.wgrad_mma's
# kernels with a group dimension, where a group has at least 8 input and 8
# output channels (one 8x8 fragment's worth); narrower groups (depthwise)
# keep the scalar kernels, whose one-lane products pad nothing.
GROUP_CHANNELS_8 = _cond(
    "C_in / groups >= 8 and C_out / groups >= 8",
    lambda c: c.c_in // c.groups >= 8 and c.c_out // c.groups >= 8,
)
register(Route(
    name="metal.grouped_csr_mma", backend="metal", matrix_unit=True, priority=10,
    conditions=(DENSE, METAL_ALL_DTYPES, GROUP_CHANNELS_8), grouped=True,
    passes=("forward", "dgrad"), kernel_file="metal/csr_mma.metal",
    summary="the implicit GEMM of metal.csr_mma per group: a threadgroup per (block of 32 rows of "
    "the view's row order, "
    "group, column block of 16-128 of the group's outputs), the group's slice of the gathered "
    "rows and of W[k] staged 16 input channels at a time, 8x8 float fragments, the same rounds "
    "and fixed order. Per output row of E edges it reads E x C_in input values once per column "
    "block of a group (once for groups of <= 128 outputs), W[k]'s group slices once per 32 rows, "
    "and writes C_out values once; its E x C_in / G x C_out MACs run on 8x8 matrices with "
    "C_in / G padded to a multiple of 8 and C_out / G to the column block (2x at 8 "
    "channels a group). Priority: above metal.grouped_fetch_on_demand, which per row reads each "
    "gathered input value once per output channel of its group (C_out / G times) and each W "
    "element once per edge, and runs the same MACs one lane at a time",
))
register(Route(
    name="metal.grouped_wgrad_mma", backend="metal", matrix_unit=True, priority=10,
    conditions=(DENSE, METAL_ALL_DTYPES, GROUP_CHANNELS_8), grouped=True, passes=("wgrad",),
    kernel_file="metal/wgrad_mma.metal",
    summary="the weight gradient of metal.wgrad_mma per group: a 32 x 32 or 32 x 64 block of "
    "one group's dW[k] per threadgroup (blocks over group, input block, output block), 16-edge "
    "chunks of the group's x columns (transposed) and ct columns staged through threadgroup "
    "memory, P partitions of each offset's chunks reduced in order. Per edge it reads the "
    "group's C_in / G x values once per output block and C_out / G ct values once per input "
    "block; its E x C_in / G x C_out MACs run on 8x8 matrices, C_in / G padded to 32 and "
    "C_out / G to 32 or 64 (16x at 8 channels a group). Priority: above "
    "metal.grouped_wgrad, whose one thread per weight element reads both values of every edge "
    "of its offset (2 x E x C_in / G x C_out reads) and runs the MACs one lane at a time, with "
    "only K x C_in / G x C_out threads",
))
register(Route(
    name="metal.grouped_fetch_on_demand", backend="metal", priority=0,
    conditions=(DENSE, METAL_ALL_DTYPES), grouped=True, passes=("forward", "dgrad"),
    kernel_file="metal/grouped.metal",
    summary="one thread per (row, output channel) over the CSR edges, reading the C_in / groups "
    "input channels of its group",
))
register(Route(
    name="metal.grouped_wgrad", backend="metal", priority=0,
    conditions=(DENSE, METAL_ALL_DTYPES), grouped=True, passes=("wgrad",),
    kernel_file="metal/grouped.metal",
    summary="one thread per element of the (K, C_in / groups, C_out) weight gradient over chunks "
    "of the kernel-major edges, partial sums reduced in order",
))


register(Route(
    name="cuda.grouped_fetch_on_demand", backend="cuda", priority=0, conditions=(DENSE,),
    grouped=True, passes=("forward", "dgrad"), kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="one thread per (row, output channel) over the CSR edges, reading the C_in / groups "
    "input channels of its group",
))
register(Route(
    name="cuda.grouped_wgrad", backend="cuda", priority=0, conditions=(DENSE,),
    grouped=True, passes=("wgrad",), kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="one thread per element of the (K, C_in / groups, C_out) weight gradient over chunks "
    "of the kernel-major edges, partial sums reduced in order",
))


# ------------------------------------------------------------------ CUDA routes
HALF = _cond("features float16 or bfloat16", lambda c: c.dtype in ("float16", "bfloat16"))
MMA_CHANNELS = _cond(
    "C_in and C_out multiples of 16, at most 1024",
    lambda c: c.c_in % 16 == 0 and c.c_out % 16 == 0 and c.c_in <= 1024 and c.c_out <= 1024,
)
K_LE_64 = _cond("K <= 64", lambda c: c.k <= 64)

register(Route(
    name="cuda.pointwise_mma", backend="cuda", priority=110,
    conditions=(DENSE, KERNEL_1, STRIDE_1, NO_PAD_DIL, NO_TARGET, FORWARD_KIND, HALF, MMA_CHANNELS),
    passes=("forward", "dgrad"), uses_relation=False, kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="x @ W[0] on tensor cores: cuda.sorted_mma's kernel over the rows in order (no plan); "
    "one kernel where cuBLAS's matmul costs the host several launches' time",
))
register(Route(
    name="cuda.pointwise", backend="cuda", priority=100,
    conditions=(DENSE, KERNEL_1, STRIDE_1, NO_PAD_DIL, NO_TARGET, FORWARD_KIND, HALF),
    passes=("forward", "dgrad"), uses_relation=False, kernel_file="mlx_lattice/backends/cuda/routes.py",
    summary="x @ W[0] with mx.matmul (cuBLAS); half precision only, since float32 matmul "
    "may run in TF32",
))
register(Route(
    name="cuda.sorted_mma", backend="cuda", priority=80,
    conditions=(DENSE, HALF, MMA_CHANNELS, K_LE_64), passes=("forward", "dgrad"),
    kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="output-stationary implicit GEMM on tensor cores (WMMA 16x16x16, fp32 accumulation) "
    "over the sorted plan, 64 rows (128 as a tuner variant) by up to 128 output channels per "
    "block (fewer where a layer's few rows would leave the GPU under-filled); offsets absent from a block's masks are skipped; the input gradient reads W "
    "transposed and mirrored where it lies",
))
register(Route(
    name="cuda.fetch_on_demand", backend="cuda", priority=0, conditions=(DENSE,),
    passes=("forward", "dgrad"), kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="one thread per (row, output channel) over the CSR edges",
))
register(Route(
    name="cuda.pointwise_wgrad_mma", backend="cuda", priority=110,
    conditions=(DENSE, KERNEL_1, STRIDE_1, NO_PAD_DIL, NO_TARGET, FORWARD_KIND, HALF, MMA_CHANNELS),
    passes=("wgrad",), uses_relation=False, kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="dW[0] = x^T G on tensor cores: cuda.wgrad_mma's kernel over chunks of rows, partial "
    "sums reduced in order",
))
register(Route(
    name="cuda.pointwise_wgrad", backend="cuda", priority=100,
    conditions=(DENSE, KERNEL_1, STRIDE_1, NO_PAD_DIL, NO_TARGET, FORWARD_KIND, HALF),
    passes=("wgrad",), uses_relation=False, kernel_file="mlx_lattice/backends/cuda/routes.py",
    summary="dW[0] = x^T G with mx.matmul (cuBLAS reads x transposed in place); half precision "
    "only, as cuda.pointwise",
))
register(Route(
    name="cuda.wgrad_mma", backend="cuda", priority=80,
    conditions=(DENSE, HALF, MMA_CHANNELS), passes=("wgrad",), kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="per-offset X^T G on tensor cores over edge chunks (256 edges at 128 x 128 channels, "
    "longer for wider), up to 128 x 128 of dW per block, partial sums reduced in order",
))
register(Route(
    name="cuda.wgrad_direct", backend="cuda", priority=0, conditions=(DENSE,),
    passes=("wgrad",), kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="one thread per weight element over chunks of the kernel-major edges (256 or more), "
    "partial sums reduced in order",
))


# ------------------------------------------------------------------ map building
# Relations (hash table, output support, CSR edges, neighbour map) are built
# where the coordinates are hashed: CUDA or Metal when the default device is
# such a GPU.
register(Route(
    name="cpu.hash_map", backend="cpu", priority=0, conditions=(), passes=("map",),
    kernel_file="src/cpu/kernel_map.cpp",
    summary="open-addressing table on packed keys; relations by batched lookups, count then fill",
))
register(Route(
    name="cuda.hash_map", backend="cuda", priority=0, conditions=(), passes=("map",),
    kernel_file="mlx_lattice/backends/cuda/maps.py",
    summary="atomicCAS table on packed keys; one thread per (row, offset), symmetric half lookup; "
    "count then fill with one host sync per map; arrays equal to cpu.hash_map's",
))
register(Route(
    name="metal.hash_map", backend="metal", priority=0, conditions=(), passes=("map",),
    kernel_file="metal/map_build.metal",
    summary="32-bit CAS table of row indices; one thread per output row, count then fill with one host "
    "sync per map; supports by a bitonic sort of candidate keys; arrays equal to cpu.hash_map's",
))


# ------------------------------------------------------------------ neighbour queries
# k nearest and radius queries (mlx_lattice/neighbors.py): one route per
# backend and pass, each a key of its backend's neighbour_routes (Metal:
# the route table of src/metal/neighbors.cpp). The GPU routes share one grid
# (metal::neighbor_params, whose limits the conditions state); a query
# outside them runs on the CPU, on record.
NBR_ROWS = _cond(
    "at most 2^30 queries and 2^28 points", lambda c: c.n_out <= 1 << 30 and c.n_in <= 1 << 28
)
NBR_BATCHES = _cond("point batch indices below 2^20", lambda c: c.batches <= 1 << 20)
# Float32 squared distances: (2 * 2^60)^2 * 3 and (2^60)^2 stay finite, and
# (2^-60)^2 normal.
NBR_RANGE_F32 = _cond(
    "coordinates within 2^60 of the origin (float32 squared distances)", lambda c: c.coord_max <= 2.0**60
)
NBR_RADIUS_F32 = _cond(
    "2^-60 <= radius <= 2^60 (float32 squared radius)", lambda c: 2.0**-60 <= c.radius <= 2.0**60
)
# The grid's cell side is a float32 (CUDA's distances are float64).
NBR_RADIUS_FINITE = _cond(
    "radius a positive finite float32 (2^-149 <= radius < 2^128)", lambda c: 2.0**-149 <= c.radius < 2.0**128
)

register(Route(
    name="cpu.knn", backend="cpu", priority=0, conditions=(), passes=("knn",), uses_relation=False,
    kernel_file="src/cpu/neighbors.cpp",
    summary="hash grid of (batch, cell) keys; Chebyshev shells of cells around the query, clipped to "
    "its item's box, with a bounded max-heap; float64 squared distances; 512-query chunks on the "
    "thread pool",
))
register(Route(
    name="cpu.radius", backend="cpu", priority=0, conditions=(), passes=("radius",), uses_relation=False,
    kernel_file="src/cpu/neighbors.cpp",
    summary="hash grid of (batch, cell) keys, cells 1.001 r wide; the 27 cells around the query; "
    "float64 squared distances, hits sorted per query and laid out by the counts' prefix sum",
))
register(Route(
    name="cuda.knn", backend="cuda", priority=0, conditions=(NBR_ROWS, NBR_BATCHES), passes=("knn",),
    uses_relation=False, kernel_file="mlx_lattice/backends/cuda/neighbors.py",
    summary="dense grid per batch item (count, scan, fill); one thread per query over Chebyshev "
    "shells of cells with a bounded list in its output slice; float64 squared distances in the "
    "CPU's order: arrays equal to cpu.knn's; one host sync (the edge count)",
))
register(Route(
    name="cuda.radius", backend="cuda", priority=0, conditions=(NBR_ROWS, NBR_BATCHES, NBR_RADIUS_FINITE),
    passes=("radius",), uses_relation=False, kernel_file="mlx_lattice/backends/cuda/neighbors.py",
    summary="the grid of cuda.knn; one thread per query over the cells of [x - r, x + r], count then "
    "fill; arrays equal to cpu.radius's; one host sync (the edge count)",
))
register(Route(
    name="metal.knn", backend="metal", priority=0, conditions=(NBR_ROWS, NBR_BATCHES, NBR_RANGE_F32),
    passes=("knn",), uses_relation=False, kernel_file="metal/neighbors.metal",
    summary="dense grid per batch item (count, scan, fill); one thread per query over Chebyshev "
    "shells of cells with a bounded max-heap in its output slice, sorted in place; integral "
    "coordinates: 64-bit integer squared distances (cpu.knn's neighbours), else float32; one host "
    "sync (the edge count)",
))
register(Route(
    name="metal.radius", backend="metal", priority=0,
    conditions=(NBR_ROWS, NBR_BATCHES, NBR_RANGE_F32, NBR_RADIUS_F32),
    passes=("radius",), uses_relation=False, kernel_file="metal/neighbors.metal",
    summary="the grid of metal.knn; one thread per query over the cells of [x - r, x + r], count "
    "then fill (a bounded max-heap, sorted in place); integral coordinates: 64-bit integer squared "
    "distances (cpu.radius's neighbours, boundary included), else float32; one host sync",
))


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

