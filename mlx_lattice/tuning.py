"""Per-shape route tuning: where more than one route's predicate holds for a
convolution product, time each of them (and each variant of a route that
has some) on the call's own data, take the fastest, and keep the choice in a
persistent cache. See docs/tuning.md.

Modes (``MLX_LATTICE_TUNE`` at import, :func:`set_mode` or :func:`using`):

- ``off``: the registry's static order (predicates and priorities), as
  :func:`mlx_lattice.routes.select` answers;
- ``cached`` (the default): a choice read from the cache where the cache has
  the product's key, else the static order;
- ``tune``: as ``cached``, and a key the cache lacks is measured on the
  first call that has it, then written to the cache.

Routes named explicitly per pass (``MLX_LATTICE_ROUTE_FORWARD``, ``_DGRAD``,
``_WGRAD``: comma lists of route names; :func:`force`) are taken in every
mode wherever their predicate holds.

Key: backend, device (CPU model, instruction-set path and thread count /
GPU name and tier), dtype, pass, K, C_in, C_out, groups, map kind, edges and
output rows bucketed by powers of two, the candidate set (so a route
registered or a predicate changed makes a new key) and this package's
version. Forward, input gradient and weight gradient are tuned apart: a
convolution call measured in ``tune`` mode measures the input-gradient and
weight-gradient products it will have in the backward pass too (on its
relation, its features and a random cotangent), so that autodiff, which
asks for their routes with no data at hand, finds them decided.

Measurement: every candidate is a registered route whose predicate holds
for the product (the registry's routes are oracle-tested); non-deterministic
routes (float atomics) are left out unless the static choice is one. Each
candidate runs once on the data (its output must equal the static route's
within the dtype's tolerance, else it is dropped with a warning), then the
candidates are timed in turns (``mx.eval`` of the product alone) for at least
``min_rounds`` rounds and until ``per_candidate_s`` of each was timed, at
most ``max_rounds``; the best time counts. Another route replaces the static
choice only when faster by ``margin``. A process starts no measurement once
``budget_s`` seconds have gone to tuning. Products without a relation
(1x1x1 pointwise) keep the static order: their other routes would need a
relation built for them.

Determinism: a key is decided once per process (measured, or read from the
cache) and then fixed; with a given cache file every run takes the same
routes and gives the same bits. Two machines (or caches) may take different
routes for the same layer; results then agree within the dtype's tolerance,
not bit for bit.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field, fields, replace
from types import SimpleNamespace

import numpy as np
import mlx.core as mx

from . import autodiff, backends, diagnostics, routes
from .quantized import QuantizedWeight
from .tuning_cache import FORMAT_VERSION, TuningCache

MODES = ("off", "cached", "tune")
PASSES = routes.DIRECTIONS
DEFAULT_MODE = "cached"
ENV_MODE = "MLX_LATTICE_TUNE"
ENV_BUDGET = "MLX_LATTICE_TUNE_BUDGET"
ENV_FORCE = {p: f"MLX_LATTICE_ROUTE_{p.upper()}" for p in PASSES}
SOURCES = ("static", "tuner", "cache", "forced")

# Output agreement a candidate must show with the static route (max abs
# difference over max |static output|): routes sum in different orders.
TOLERANCE = {"float32": 1e-3, "float16": 3e-2, "bfloat16": 1e-1}


@dataclass
class Settings:
    mode: str = DEFAULT_MODE
    budget_s: float = 10.0  # seconds of measurement per process
    per_candidate_s: float = 0.01  # timed seconds per candidate, after min_rounds
    min_rounds: int = 3
    max_rounds: int = 10
    max_candidates: int = 8  # routes and variants per key, static order first
    margin: float = 0.05  # another route must be this much faster than the static one
    cache_path: str | None = None  # None: tuning_cache.default_path()


@dataclass(frozen=True)
class Candidate:
    route: str
    variant: tuple = ()  # sorted (name, value) pairs; () the route's default

    @property
    def kwargs(self) -> dict:
        return dict(self.variant)

    @property
    def label(self) -> str:
        if not self.variant:
            return self.route
        return self.route + "[" + ",".join(f"{k}={v}" for k, v in self.variant) + "]"


@dataclass(frozen=True)
class Decision:
    """A key's route: where the choice came from (``source``: tuner, cache
    or static), the static order's route and the timings (ms per candidate
    label) it was made on."""

    key: str
    route: str
    variant: tuple = ()
    source: str = "static"
    static: str = ""
    timings_ms: dict | None = None
    note: str | None = None
    shape: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return Candidate(self.route, self.variant).label


def _setting_problem(name: str, v) -> str | None:
    """Why `v` is not a value of setting `name`, or None."""
    real = isinstance(v, (int, float)) and not isinstance(v, bool)
    if name == "mode":
        return None if isinstance(v, str) and v in MODES else f"one of {MODES}"
    if name == "budget_s":  # inf: no limit
        return None if real and v >= 0 else "a number of seconds >= 0 (inf: no limit)"
    if name == "per_candidate_s":
        return None if real and 0 <= v < float("inf") else "a finite number of seconds >= 0"
    if name in ("min_rounds", "max_rounds"):
        return None if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else "an int >= 1"
    if name == "max_candidates":
        return (None if isinstance(v, int) and not isinstance(v, bool) and v >= 2
                else "an int >= 2 (the static route and at least one other)")
    if name == "margin":
        return None if real and 0 <= v < 1 else "a fraction in [0, 1)"
    if name == "cache_path":
        ok = v is None or (isinstance(v, (str, os.PathLike)) and str(os.fspath(v)).strip() != "")
        return None if ok else "None or a file path"
    return None


def _env_settings() -> Settings:
    """Settings from the environment. A bad value is refused with a warning
    naming the variable, and the default stands: the variables are read at
    import, where an exception would take the whole package down."""
    s = Settings()
    m = os.environ.get(ENV_MODE, "").strip().lower()
    if m:
        if m in MODES:
            s.mode = m
        else:
            warnings.warn(f"{ENV_MODE}={m!r} is not one of {MODES}; using {DEFAULT_MODE!r}", RuntimeWarning)
    b = os.environ.get(ENV_BUDGET, "").strip()
    if b:
        try:
            budget = float(b)
        except ValueError:
            budget = float("nan")
        if budget == budget and budget >= 0:  # NaN would never be spent, a negative one always
            s.budget_s = budget
        else:
            warnings.warn(f"{ENV_BUDGET}={b!r} is not a number of seconds >= 0 (inf: no limit); "
                          f"using {s.budget_s}", RuntimeWarning)
    return s


def _check_forced(direction: str, names) -> tuple:
    if direction not in PASSES:
        raise ValueError(f"pass must be one of {PASSES}, got {direction!r}")
    names = (names,) if isinstance(names, str) else tuple(names)
    for n in names:
        try:
            r = routes.get(n)
        except KeyError:
            raise ValueError(f"no route named {n!r}") from None
        if direction not in r.passes:
            raise ValueError(f"route {n} serves {'/'.join(r.passes)}, not {direction}")
    return names


def _env_forced() -> dict:
    """Routes named per pass in the environment: a comma list of route
    names. A list naming an unknown route, or one that does not serve the
    pass, is refused whole with a warning (see :func:`_env_settings`)."""
    out = {}
    for p, var in ENV_FORCE.items():
        names = [n.strip() for n in os.environ.get(var, "").split(",") if n.strip()]
        if names:
            try:
                out[p] = _check_forced(p, names)
            except ValueError as e:
                warnings.warn(f"{var}={os.environ[var]!r}: {e}; ignored", RuntimeWarning)
    return out


class _State:
    def __init__(self):
        self.lock = threading.RLock()
        self.settings = _env_settings()
        self.forced = _env_forced()
        self.timer = None  # None: wall_timer
        self.reset()

    def reset(self):
        self.decisions: dict[str, Decision] = {}
        self.misses: dict[str, Decision] = {}  # static for want of a cached or measured choice
        self.keys: dict = {}
        self.file = None  # the cache file's Contents, read once
        self.spent_s = 0.0
        self.devices: dict = {}


_state = _State()
_KEYS_MAX = 4096


# ------------------------------------------------------------------ settings
def mode() -> str:
    return _state.settings.mode


def set_mode(m: str) -> None:
    """``off``, ``cached`` or ``tune`` (see the module doc)."""
    configure(mode=m)


def settings() -> Settings:
    return replace(_state.settings)


def configure(**kw) -> None:
    """Set fields of :class:`Settings` (mode, budget_s, per_candidate_s,
    min_rounds, max_rounds, max_candidates, margin, cache_path). A new
    cache path is read afresh; choices already made stay (see :func:`reset`)."""
    names = {f.name for f in fields(Settings)}
    unknown = set(kw) - names
    if unknown:
        raise TypeError(f"unknown tuning settings {sorted(unknown)}; known: {sorted(names)}")
    for k, v in kw.items():
        why = _setting_problem(k, v)
        if why is not None:
            raise ValueError(f"tuning setting {k} must be {why}, got {v!r}")
    rounds = (kw.get("min_rounds", _state.settings.min_rounds), kw.get("max_rounds", _state.settings.max_rounds))
    if rounds[0] > rounds[1]:
        raise ValueError(f"tuning settings: min_rounds ({rounds[0]}) is more than max_rounds ({rounds[1]})")
    with _state.lock:
        if "cache_path" in kw and kw["cache_path"] != _state.settings.cache_path:
            _state.file = None
        for k, v in kw.items():
            setattr(_state.settings, k, os.fspath(v) if k == "cache_path" and v is not None else v)


def set_forced(**per_pass) -> None:
    """Name the route(s) to take per pass, e.g. ``set_forced(wgrad="cpu.wgrad_gemm")``;
    a list names one per backend (the first of the call's backend whose
    predicate holds is taken); None clears a pass."""
    with _state.lock:
        for p, names in per_pass.items():
            if names is None:
                if p not in PASSES:
                    raise ValueError(f"pass must be one of {PASSES}, got {p!r}")
                _state.forced.pop(p, None)
            else:
                _state.forced[p] = _check_forced(p, names)


@contextlib.contextmanager
def force(**per_pass):
    """Within the block, take the named routes (see :func:`set_forced`)."""
    before = dict(_state.forced)
    set_forced(**per_pass)
    try:
        yield
    finally:
        _state.forced = before


@contextlib.contextmanager
def using(timer=None, **kw):
    """Within the block, these settings (see :func:`configure`) and, with
    `timer`, that timer (``timer(label, fn) -> seconds``: runs ``fn`` once)."""
    with _state.lock:
        before, before_timer, before_file = replace(_state.settings), _state.timer, _state.file
    configure(**kw)
    if timer is not None:
        _state.timer = timer
    try:
        yield
    finally:
        with _state.lock:
            if before.cache_path != _state.settings.cache_path:
                _state.file = before_file
            _state.settings, _state.timer = before, before_timer


def reset() -> None:
    """Forget every choice made or read in this process and the time spent
    measuring (the cache file stays)."""
    with _state.lock:
        _state.reset()


def cache() -> TuningCache:
    return TuningCache(_state.settings.cache_path)


def decisions() -> list[Decision]:
    """The choices made or read in this process, by key."""
    with _state.lock:
        return [_state.decisions[k] for k in sorted(_state.decisions)]


def spent_s() -> float:
    return _state.spent_s


# ------------------------------------------------------------------ keys
def device_id(backend: str, tier: str) -> str:
    """The machine a timing belongs to: CPU model, instruction-set path and
    thread count, or GPU name and capability tier."""
    with _state.lock:
        base = _state.devices.get(backend)
        if base is None:
            base = _state.devices[backend] = backends.get(backend).device_name()
    threads = backends.get(backend).threads()
    return f"{base} [{tier}, {threads} threads]" if threads else f"{base} [{tier}]"


def _bucket(n: int) -> str:
    return f"<2^{max(int(n), 0).bit_length()}"


def _pointwise(ctx: routes.RouteContext) -> bool:
    """A product without a relation: the 1x1x1, stride-1, unpadded call that
    keeps its rows (ops) and autodiff's products of one."""
    return (
        ctx.kernel_size == (1, 1, 1) and ctx.stride == (1, 1, 1) and ctx.padding == (0, 0, 0)
        and not ctx.explicit_target and ctx.map_kind in ("forward", "submanifold")
    )


@functools.lru_cache(maxsize=1024)
def _variant_items(backend: str, route: str, a: int, b: int) -> tuple[tuple, ...]:
    """The route's variants for A -> B channels as sorted (name, value)
    pairs, the default (()) first: a function of the channel counts alone,
    so kept (a new sample's sizes make every context new)."""
    return tuple(tuple(sorted(v.items())) for v in backends.get(backend).variants(route, a, b))


def candidates(ctx: routes.RouteContext, static: routes.Route | None = None) -> list[Candidate]:
    """The routes (and variants) eligible for ctx, the static choice first:
    routes of ctx's backend whose predicate holds (deterministic ones only,
    unless the static choice is not), each route's default before its other
    variants. The tuner times the first ``max_candidates`` of them."""
    static = static or routes.select(ctx).route
    if static.backend != ctx.backend or _pointwise(ctx):
        return [Candidate(static.name)]
    eligible = [static] + [
        r for r in routes._ordered(ctx.backend)
        if r is not static and r.applies(ctx) and (r.deterministic or not static.deterministic)
    ]
    return list(_candidate_list(tuple(r.name for r in eligible), ctx.c_in, ctx.c_out))


@functools.lru_cache(maxsize=1024)
def _candidate_list(eligible: tuple[str, ...], a: int, b: int) -> tuple[Candidate, ...]:
    """Each eligible route's default, then each route's other variants."""
    out = [Candidate(name) for name in eligible]
    for name in eligible:
        route = routes.get(name)
        out += [Candidate(name, v) for v in _variant_items(route.backend, name, a, b)[1:]]
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def _labels(cands: tuple[Candidate, ...]) -> str:
    return ",".join(sorted(c.label for c in cands))


def shape_of(ctx: routes.RouteContext) -> dict:
    return {
        "backend": ctx.backend, "dtype": ctx.dtype, "pass": ctx.direction, "map_kind": ctx.map_kind,
        "k": ctx.k, "c_in": ctx.c_in, "c_out": ctx.c_out, "groups": ctx.groups,
        "edges": _bucket(ctx.edges), "rows": _bucket(ctx.n_out), "quantized": ctx.quantized,
    }


def key_of(ctx: routes.RouteContext, cands: list[Candidate], device: str | None = None) -> str:
    device = device or device_id(ctx.backend, ctx.tier)
    parts = [
        # the package's release, read when asked (each release starts afresh)
        f"v{FORMAT_VERSION}", f"mlx_lattice {sys.modules[__package__].__version__}", ctx.backend, device,
        ctx.dtype, ctx.direction,
        ctx.map_kind, f"K={ctx.k}", f"{ctx.c_in}->{ctx.c_out}", f"groups={ctx.groups}",
        f"edges{_bucket(ctx.edges)}", f"rows{_bucket(ctx.n_out)}",
    ]
    if ctx.quantized:
        parts.append(f"quantized group {ctx.group_size} {ctx.weight_layout}")
    parts.append(_labels(tuple(cands)))
    return " | ".join(parts)


def _key_info(ctx: routes.RouteContext, static: routes.Route):
    """(key, candidates) of ctx, or None when there is nothing to choose."""
    # the device's name is fixed per backend, but a CPU's key holds the
    # thread count, which may change between calls
    memo = (ctx, backends.get(ctx.backend).threads())
    hit = _state.keys.get(memo, False)
    if hit is not False:
        return hit
    cands = candidates(ctx, static)
    info = (key_of(ctx, cands, device_id(ctx.backend, ctx.tier)), cands) if len(cands) > 1 else None
    if len(_state.keys) >= _KEYS_MAX:
        _state.keys.clear()
    _state.keys[memo] = info
    return info


# ------------------------------------------------------------------ measuring
def _eval(out) -> None:
    if isinstance(out, mx.array):
        mx.eval(out)
    elif isinstance(out, (list, tuple)):
        mx.eval(*[o for o in out if isinstance(o, mx.array)])


def wall_timer(label: str, fn) -> float:
    """Seconds of one evaluation of fn's product (the default timer)."""
    t0 = time.perf_counter()
    _eval(fn())
    return time.perf_counter() - t0


def _host(out) -> np.ndarray:
    if isinstance(out, mx.array):
        return np.array(out.astype(mx.float32))
    return np.asarray(out, dtype=np.float32)


def _agrees(out: np.ndarray, ref: np.ndarray, dtype: str) -> bool:
    if out.shape != ref.shape:
        return False
    if not np.all(np.isfinite(out)) and not np.array_equal(np.isfinite(out), np.isfinite(ref)):
        return False
    scale = max(float(np.max(np.abs(ref), initial=0.0)), 1e-6)
    diff = float(np.max(np.abs(np.nan_to_num(out) - np.nan_to_num(ref)), initial=0.0))
    return diff <= TOLERANCE.get(dtype, 1e-1) * scale


@dataclass
class Measurement:
    times_s: dict  # label -> best seconds
    dropped: dict  # label -> why
    winner: Candidate | None
    note: str | None = None


def measure(ctx: routes.RouteContext, run, cands: list[Candidate], timer=None) -> Measurement:
    """Time each candidate's product (``run(route, variant_kwargs)`` returns
    it, lazily) as the module doc says; the first candidate is the static
    choice and the reference output."""
    s = _state.settings
    timer = timer or _state.timer or wall_timer
    ref = None
    alive: list[Candidate] = []
    dropped: dict = {}
    for c in cands:
        fn = (lambda c=c: run(c.route, c.kwargs))
        try:
            out = _host(fn())
        except Exception as e:  # a candidate that cannot run this product is not one
            if c is cands[0]:
                return Measurement({}, {c.label: repr(e)}, None, f"the static route raised {e!r}")
            dropped[c.label] = f"raised {e.__class__.__name__}: {e}"
            continue
        if ref is None:
            if not np.all(np.isfinite(out)):
                # NaN or Inf in the call's data: no output to check the
                # others against, and nothing worth timing.
                return Measurement({}, {}, c, "the static route's output is not finite")
            ref = out
        elif not _agrees(out, ref, ctx.dtype):
            dropped[c.label] = "output differs from the static route's beyond the dtype's tolerance"
            warnings.warn(f"route tuner: {c.label} disagrees with {cands[0].label} on a {ctx.direction} "
                          f"product ({ctx.c_in}->{ctx.c_out}, K={ctx.k}); left out", RuntimeWarning)
            continue
        alive.append(c)
    if len(alive) < 2:
        return Measurement({}, dropped, alive[0] if alive else None, "one candidate left")
    best = {c.label: float("inf") for c in alive}
    timed = {c.label: 0.0 for c in alive}
    rounds = 0
    while rounds < s.min_rounds or (
        rounds < s.max_rounds and min(timed.values()) < s.per_candidate_s
    ):
        for c in alive:
            t = float(timer(c.label, lambda c=c: run(c.route, c.kwargs)))
            best[c.label] = min(best[c.label], t)
            timed[c.label] += t
        rounds += 1
    static = alive[0]
    fastest = min(alive, key=lambda c: best[c.label])
    winner = static
    if fastest is not static and best[fastest.label] < best[static.label] * (1.0 - s.margin):
        winner = fastest
    return Measurement(best, dropped, winner)


# ------------------------------------------------------------------ the call's data
_SEED = 0x7E5ED


def _synthetic(shape, dtype, salt=0) -> mx.array:
    a = np.random.default_rng(_SEED + salt).standard_normal(tuple(shape)).astype(np.float32)
    return mx.array(a).astype(dtype)


def _concrete(a: mx.array, salt: int) -> mx.array:
    """a itself when it can be evaluated here; inside a function transform
    that forbids evaluation (mx.compile), random values of its shape."""
    try:
        mx.eval(a)
        return a
    except Exception:
        return _synthetic(a.shape, a.dtype, salt)


class CallProbe:
    """The data of one convolution call, to measure its three products on:
    its features, weight and relation, and a random cotangent for the
    backward products (built once the tuner needs them). ``execute(backend,
    route, op, a, b, view, k=, groups=, variant=)`` runs one product
    (default ``backend.launch``; the Metal tests pass one running the
    route's program through the harness)."""

    def __init__(self, feats: mx.array, weight, relation, groups: int = 1, execute=None):
        self.feats, self.weight, self.relation, self.groups = feats, weight, relation, groups
        self.execute = execute or (lambda backend, route, op, *args, **kw: backend.launch(route, op, *args, **kw))
        self.done = False
        self._data = None

    def passes(self, ctx: routes.RouteContext, from_route: str) -> list:
        """(context, run) of the call's forward product and, for a float
        weight, the input-gradient and weight-gradient products autodiff
        will ask for; run(route, variant) returns a product (lazily). The
        contexts cost nothing; the data is made on the first run."""
        rel, g = self.relation, self.groups
        if rel is None:
            return []
        if isinstance(self.weight, QuantizedWeight):
            if not backends.get(ctx.backend).quantized_products:
                return []
            return [(ctx, lambda route, kw: self._run(ctx, 0, route, kw))]
        k, a, b = rel.kernel_volume, ctx.c_in, ctx.c_out
        # The two views autodiff reads (the input gradient's: the relation
        # swapped, or the same one where it is symmetric), unbuilt.
        back = SimpleNamespace(kind=rel.kind, edges=rel.edges, rows=rel.n_in)
        view = SimpleNamespace(kind=rel.kind, edges=rel.edges, rows=rel.n_out)
        dctx = autodiff.context(ctx.backend, "dgrad", back, k, b, a, rel.n_out, ctx.dtype, from_route, g)
        wctx = autodiff.context(ctx.backend, "wgrad", view, k, a, b, rel.n_in, ctx.dtype, from_route, g)
        return [(c, lambda route, kw, i=i: self._run(ctx, i, route, kw)) for i, c in enumerate((ctx, dctx, wctx))]

    def _prepare(self, ctx) -> dict:
        """The arrays the products read, evaluated (once per probe)."""
        if self._data is not None:
            return self._data
        backend = backends.get(ctx.backend)
        d = {"x": _concrete(self.feats, 1), "backend": backend}
        if isinstance(self.weight, QuantizedWeight):
            codes, scales, biases = self.weight.kernel_major()
            mx.eval(codes, scales, biases)
        else:
            # the weight as the call's products read it (contiguous on CUDA)
            w = _concrete(backend.mapped_weight(self.weight), 2)
            view = backend.product_view(self.relation)
            back, mirrored = autodiff.input_gradient_view(view)
            d.update(w=w, flip=(True, mirrored), view=view, back=back,
                     ct=_synthetic((self.relation.n_out, w.shape[2]), d["x"].dtype, 3))
            mx.eval(d["w"], d["ct"])
        self._data = d
        return d

    def _run(self, ctx, i: int, route: str, kw: dict):
        d, g, rel = self._prepare(ctx), self.groups, self.relation
        x, backend, ex = d["x"], d["backend"], self.execute
        if "w" not in d:
            return backend.quantized_conv(route, x, self.weight, rel)
        if i == 0:
            return ex(backend, route, "conv", x, d["w"], d["view"], groups=g, variant=kw)
        if i == 1:
            # the input gradient's weight read as autodiff.conv reads it
            wt, flip = autodiff.launch_operands(backend, route, d["w"], d["flip"], g)
            return ex(backend, route, "conv", d["ct"], wt, d["back"], groups=g, variant=kw, **flip)
        return ex(backend, route, "weight_grad", x, d["ct"], d["view"], k=rel.kernel_volume, groups=g,
                  variant=kw)


def probe(feats, weight, relation, groups: int = 1) -> CallProbe | None:
    """The call's probe when the tuner may measure (mode ``tune``), else None."""
    if _state.settings.mode != "tune" or relation is None:
        return None
    return CallProbe(feats, weight, relation, groups)


# ------------------------------------------------------------------ deciding
def _file_entries() -> dict:
    """The cache file's usable entries (read once per process; see
    :func:`_cache_entry` for the others)."""
    if _state.file is None:
        _state.file = cache().contents()  # warns about what it cannot use
    return _state.file.entries


def _candidate_of(entry: dict) -> Candidate:
    return Candidate(entry["route"], tuple(sorted(entry.get("variant", {}).items())))


def _cache_entry(key: str, cands: list[Candidate]) -> tuple[dict | None, str | None]:
    """(the cache's entry for key if it names one of cands, why the file's
    entry for key cannot be used), one of them None or both. An entry the
    file holds but cannot serve is said once, naming the file and the key."""
    entry = _file_entries().get(key)
    if entry is not None:
        c = _candidate_of(entry)
        if c in cands:
            return entry, None
        known = c.route in routes._REGISTRY
        why = (f"it names {c.label}, not one of this product's eligible routes ({_labels(tuple(cands))})"
               if known else f"it names {c.route!r}, which is no registered route")
    else:
        why = _state.file.problems.get(key)
        if why is None:
            return None, None
    cache().say(f"entry {key!r}: {why}", "not used (mode tune measures the product again and replaces it)")
    return None, f"the tuning cache's entry cannot be used: {why}"


def _from_entry(key: str, entry: dict, cands: list[Candidate], static: str, shape: dict, source="cache"):
    c = _candidate_of(entry)
    if c not in cands:
        return None
    return Decision(key, c.route, c.variant, source, static, entry.get("timings_ms"),
                    entry.get("note"), shape)


def _measure_key(key: str, ctx, cands: list[Candidate], run) -> Decision:
    """Measure one key, write it to the cache, and return the decision the
    cache holds for it (an earlier writer's wins)."""
    s = _state.settings
    static = cands[0].route
    shape = shape_of(ctx)
    t0 = time.perf_counter()
    try:
        m = measure(ctx, run, cands[: max(2, s.max_candidates)])
    finally:
        _state.spent_s += time.perf_counter() - t0
    if m.winner is None or not m.times_s:
        return Decision(key, static, (), "static", static, None,
                        f"not measured: {m.note}" if m.note else None, shape)
    timings = {k: round(v * 1e3, 4) for k, v in m.times_s.items()}
    entry = {"route": m.winner.route, "variant": m.winner.kwargs, "static": static,
             "timings_ms": timings, "shape": shape}
    if m.dropped:
        entry["dropped"] = m.dropped
    mine = Decision(key, m.winner.route, m.winner.variant, "tuner", static, timings, None, shape)
    try:
        # the file's entry for the key stays where it names a candidate (an
        # earlier writer's choice); one that names none is replaced
        held = cache().merge({key: entry}, keep=lambda k, e: _candidate_of(e) in cands)[key]
    except OSError as e:
        warnings.warn(f"route tuner: cannot write the cache {cache().path} ({e}); "
                      "the choice holds for this process only", RuntimeWarning)
        return mine
    if _state.file is not None:
        _state.file.entries[key] = held
        _state.file.problems.pop(key, None)
    if _candidate_of(held) == m.winner:
        return mine
    # Another process wrote this key first: take its choice, as every
    # process sharing the cache does.
    return _from_entry(key, held, cands, static, shape) or mine


def _tune_probe(probe: CallProbe, ctx, from_route: str) -> None:
    try:
        passes = probe.passes(ctx, from_route)
    except Exception as e:
        warnings.warn(f"route tuner: cannot prepare this call's data ({e!r}); static order", RuntimeWarning)
        return
    for pctx, run in passes:
        try:
            static = routes.select(pctx)
        except ValueError:
            continue
        if static.fallback:
            continue
        info = _key_info(pctx, static.route)
        if info is None:
            continue
        key, cands = info
        if key in _state.decisions:
            continue
        _state.file = None  # another process may have measured it meanwhile
        entry, _ = _cache_entry(key, cands)
        d = _from_entry(key, entry, cands, cands[0].route, shape_of(pctx)) if entry else None
        if d is None:
            if _state.spent_s >= _state.settings.budget_s:
                _state.misses[key] = Decision(
                    key, cands[0].route, (), "static", cands[0].route, None,
                    f"not measured: the tuning budget ({_state.settings.budget_s:g} s) is spent",
                    shape_of(pctx))
                continue
            d = _measure_key(key, pctx, cands, run)
            if d.source == "static":
                _state.misses[key] = d
                continue
        _state.decisions[key] = d


def _decide(ctx, static: routes.Route, probe) -> Decision | None:
    info = _key_info(ctx, static)
    if info is None:
        return None
    key, cands = info
    d = _state.decisions.get(key)
    if d is not None:
        return d
    miss = _state.misses.get(key)
    if miss is not None and _state.settings.mode == "cached":
        return miss
    entry, unusable = _cache_entry(key, cands)
    d = _from_entry(key, entry, cands, static.name, shape_of(ctx)) if entry else None
    if d is not None:
        _state.decisions[key] = d
        return d
    if miss is None:
        why = ("no entry in the tuning cache" if _state.settings.mode == "cached"
               else "not measured: no data at hand for this product")
        if unusable:
            why = f"{unusable}; {why}" if _state.settings.mode != "cached" else unusable
        miss = _state.misses[key] = Decision(key, static.name, (), "static", static.name, None, why,
                                             shape_of(ctx))
    return miss


_STATIC = {"choice": "static", "timings_ms": None, "variant": None}


def _record(d: Decision, source: str | None = None) -> dict:
    out = {"choice": source or d.source, "timings_ms": d.timings_ms, "variant": d.variant and dict(d.variant) or None}
    if d.note:
        out["tune_note"] = d.note
    return out


def _best_of(timings: dict, route: str) -> float:
    return min((v for k, v in timings.items() if k.split("[")[0] == route), default=float("nan"))


def _reselect(sel: routes.Selection, route: routes.Route, variant: dict | None, timings: dict | None,
              why: str):
    """sel with `route` taken: the rejections say why the others lost
    (`why`: the static route's reason where it has no timing)."""
    rejected = [dict(r) for r in sel.rejected if r["route"] != route.name]
    if route is not sel.route:
        rejected.insert(0, {"route": sel.route.name, "reason": why})
    if timings:
        best = _best_of(timings, route.name)
        for r in rejected:
            t = _best_of(timings, r["route"])
            if t == t:  # measured
                r["reason"] = f"measured slower than {route.name}: {t:.3g} ms vs {best:.3g} ms"
    return routes.Selection(route, rejected, sel.fallback, variant or None)


def _forced(ctx, sel: routes.Selection, names: tuple):
    notes = []
    for n in names:
        r = routes.get(n)
        if r.backend != ctx.backend:
            continue
        why = r.failed(ctx)
        if why is None and r.uses_relation and _pointwise(ctx) and r is not sel.route:
            why = "needs a relation, and this product has none"
        if why is None:
            return (_reselect(sel, r, None, None, f"{r.name} is named for this pass"),
                    {"choice": "forced", "timings_ms": None, "variant": None})
        notes.append(f"named route {n} does not apply: {why}")
    if notes:
        return sel, {**_STATIC, "tune_note": "; ".join(notes)}
    return None


def _hook(ctx: routes.RouteContext, sel: routes.Selection, probe):
    """routes.choose's hook: the selection to run and its record's fields."""
    st = _state
    if st.forced:
        names = st.forced.get(ctx.direction)
        if names:
            out = _forced(ctx, sel, names)
            if out is not None:
                return out
    if st.settings.mode == "off" or sel.fallback or sel.route.backend != ctx.backend:
        return sel, _STATIC
    with st.lock:
        if st.settings.mode == "tune" and probe is not None and not probe.done:
            probe.done = True
            _tune_probe(probe, ctx, sel.route.name)
        d = _decide(ctx, sel.route, probe)
    if d is None:
        return sel, _STATIC
    if d.route == sel.route.name and not d.variant and not d.timings_ms:
        return sel, _record(d)
    route = routes.get(d.route)
    if route.failed(ctx) is not None:  # cannot happen: the key holds the candidates
        return sel, {**_STATIC, "tune_note": f"{d.route} does not apply: {route.failed(ctx)}"}
    why = f"{d.route} was chosen by the tuner ({d.source})"
    return _reselect(sel, route, dict(d.variant), d.timings_ms, why), _record(d)


routes.set_choice_hook(_hook)


# ------------------------------------------------------------------ reports
def table(items=None) -> str:
    """A text table of decisions (default: this process's), one row each."""
    items = decisions() if items is None else list(items)
    rows = [("pass", "map kind", "K", "C_in->C_out", "dtype", "edges", "rows", "static", "chosen", "from",
             "timings (ms)")]
    for d in items:
        sh = d.shape or {}
        times = ", ".join(f"{k} {v:.3g}" for k, v in sorted((d.timings_ms or {}).items(), key=lambda kv: kv[1]))
        rows.append((str(sh.get("pass", "?")), str(sh.get("map_kind", "?")), str(sh.get("k", "?")),
                     f"{sh.get('c_in', '?')}->{sh.get('c_out', '?')}", str(sh.get("dtype", "?")),
                     str(sh.get("edges", "?")), str(sh.get("rows", "?")), d.static, d.label, d.source, times))
    return diagnostics.format_table(rows)


def cached_decisions(path=None) -> list[Decision]:
    """The cache file's usable entries as decisions (every machine and
    version; the others are warned about, see :func:`cache_report`)."""
    entries = TuningCache(path if path is not None else _state.settings.cache_path).load()
    return [_cached_decision(key, e) for key, e in sorted(entries.items())]


def _cached_decision(key: str, e: dict) -> Decision:
    return Decision(key, e["route"], tuple(sorted(e.get("variant", {}).items())), "cache",
                    e.get("static", ""), e.get("timings_ms"), e.get("note"), e.get("shape") or {})


# A key's last field: its candidates' labels, joined by commas (a variant's
# label holds commas of its own, inside brackets).
_LABEL = re.compile(r"[^,\[\]]+(?:\[[^\]]*\])?")


def stale_entry(key: str, entry: dict) -> str | None:
    """Why a well-formed entry can never be used by this release, judged
    from its key alone (the candidates it was measured among), or None.
    Keys of other releases and format versions are not judged: another
    install may read them."""
    parts = key.split(" | ")
    release = sys.modules[__package__].__version__
    if len(parts) < 3 or parts[0] != f"v{FORMAT_VERSION}" or parts[1] != f"mlx_lattice {release}":
        return None
    labels = _LABEL.findall(parts[-1])
    unknown = sorted({lb.split("[")[0] for lb in labels} - set(routes._REGISTRY))
    if entry["route"] not in routes._REGISTRY:
        return f"it names {entry['route']!r}, which is no registered route"
    if unknown:
        return f"its key lists routes that are not registered ({', '.join(unknown)}): no product has this key"
    label = _candidate_of(entry).label
    if label not in labels:
        return f"it names {label}, not one of the key's eligible routes ({parts[-1]})"
    return None


def cache_report(path=None) -> dict:
    """What a cache file holds, for ``python -m mlx_lattice tune --show``:
    {"path", "state" and "reason" (see :class:`tuning_cache.Contents`),
    "decisions" (usable entries), "unusable" (key -> why: malformed, or
    stale for this release)}. Says nothing (no warnings)."""
    c = TuningCache(path if path is not None else _state.settings.cache_path)
    got = c.read()
    unusable = dict(got.problems)
    usable = []
    for key, e in sorted(got.entries.items()):
        why = stale_entry(key, e)
        if why is None:
            usable.append(_cached_decision(key, e))
        else:
            unusable[key] = why
    return {"path": str(c.path), "state": got.state, "reason": got.reason, "decisions": usable,
            "unusable": unusable}


def repair_cache(path=None) -> dict:
    """Make the cache file one this release reads whole (for ``python -m
    mlx_lattice tune``): a file of another format or version is replaced by
    an empty cache, and malformed and stale entries (:func:`stale_entry`)
    are dropped. Raises OSError where the file cannot be written. Returns
    {"path", "replaced", "dropped"} (see :meth:`TuningCache.repair`)."""
    c = TuningCache(path if path is not None else _state.settings.cache_path)
    c.check_writable()
    out = c.repair(stale_entry)
    with _state.lock:
        if c.path == cache().path:
            _state.file = None
    return {"path": str(c.path), **out}
