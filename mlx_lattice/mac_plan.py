"""Which Metal route each convolution call of a recorded run would take on a
Mac of a given tier, and the share of the run's multiply-adds on matrix
units (simdgroup matrices or TensorOps), on the GPU's scalar kernels, and
off the GPU; and which route each of its neighbour queries (knn, radius)
would take.

A run recorded anywhere (``diagnostics.record()`` dumped with
``RouteLog.dump``, or the JSON lines of ``MLX_LATTICE_ROUTE_LOG``) holds
every call's route context; each is put to the registry again as the Mac
would see it (backend ``metal``, its tier and TensorOps availability, and
optionally another feature dtype): selection is a pure function of the
context (``routes.select``), so no Mac is needed to ask.

``python -m mlx_lattice routes --mac m4 --log run.json [--dtype bfloat16]``
"""

from __future__ import annotations

import json
import warnings
from collections import defaultdict
from pathlib import Path

from . import diagnostics, routes

# A GPU and macOS release per tier: M3 / M4 (no TensorOps), M5 (Apple10,
# TensorOps from macOS 26.2).
TIERS = {
    "m3": ("applegpu_g15s", "15.5"),
    "m4": ("applegpu_g16s", "15.5"),
    "m5": ("applegpu_g17s", "26.2"),
}

_FIELDS = set(routes.RouteContext._fields)
# What a recorded convolution call must hold for its context to be rebuilt,
# and the type every context field it holds must have.
_REQUIRED = ("op", "map_kind", "dtype", "kernel_size", "c_in", "c_out", "n_out", "edges")
# A recorded neighbour query's (its op "knn" or "radius"; the context's
# other fields default).
_REQUIRED_QUERY = ("op", "n_in", "n_out", "k")
_STRINGS = {"op", "map_kind", "dtype", "backend", "coord_dtype", "weight_layout", "tier", "direction"}
_TRIPLES = {"kernel_size", "stride", "padding", "dilation"}
_FLAGS = {"explicit_target", "quantized", "tensor_ops"}
_COUNTS = {"c_in", "c_out", "n_in", "n_out", "edges", "k", "group_size", "groups", "batches"}
_NUMBERS = {"radius", "coord_max"}


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _query(record: dict) -> bool:
    """Whether a record is a neighbour query's."""
    return record.get("op") in routes.NEIGHBOR_PASSES


def record_problem(record) -> str | None:
    """Why a route record cannot be planned (a map record never is), or None."""
    if not isinstance(record, dict):
        return f"a record is a JSON object, got {type(record).__name__}"
    if record.get("op") == "map":
        return None
    missing = [f for f in (_REQUIRED_QUERY if _query(record) else _REQUIRED) if f not in record]
    if missing:
        return f"missing {', '.join(missing)}"
    for f, v in record.items():
        if f in _STRINGS and not isinstance(v, str):
            return f"{f} is {v!r}, not a string"
        if f in _COUNTS and not (_int(v) and v >= 0):
            return f"{f} is {v!r}, not a count"
        if f in _FLAGS and not isinstance(v, bool):
            return f"{f} is {v!r}, not true or false"
        if f in _NUMBERS and not (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0):
            return f"{f} is {v!r}, not a number >= 0"
        if f in _TRIPLES and not (isinstance(v, (list, tuple)) and len(v) == 3 and all(_int(x) for x in v)) \
                and not (f == "kernel_size" and v is None):  # products autodiff makes without one
            return f"{f} is {v!r}, not three integers"
    if _query(record):
        if record.get("direction", record["op"]) != record["op"]:
            return f"direction is {record['direction']!r}, not the query's {record['op']!r}"
    elif record.get("direction", "forward") not in routes.DIRECTIONS:
        return f"direction is {record['direction']!r}, not one of {routes.DIRECTIONS}"
    return None


def load(path) -> list[dict]:
    """Convolution and neighbour-query records from a RouteLog dump (a JSON
    list) or a route log of JSON lines; map records are left out. A line that is not JSON, or a
    record that cannot be planned (:func:`record_problem`), is skipped
    with a warning naming the file and where in it."""
    text = Path(path).read_text()
    try:
        data = json.loads(text)
        items = list(enumerate(data if isinstance(data, list) else [data]))
        where = "record {}"
    except json.JSONDecodeError:
        items, where = [], "line {}"
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                items.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                warnings.warn(f"route log {path}: line {n} is not JSON ({e}); skipped", RuntimeWarning,
                              stacklevel=2)
    out = []
    for n, r in items:
        why = record_problem(r)
        if why is not None:
            warnings.warn(f"route log {path}: {where.format(n)}: {why}; skipped", RuntimeWarning, stacklevel=2)
        elif r.get("op") != "map":
            out.append(r)
    return out


def multiply_adds(record: dict) -> int:
    """Useful multiply-adds of a call: its edges (rows for a 1x1x1 product
    without a relation) times C_in / groups times C_out."""
    edges = record["edges"] or record["n_out"]
    return int(edges) * (int(record["c_in"]) // max(int(record.get("groups", 1)), 1)) * int(record["c_out"])


def mac_context(record: dict, tier: str, dtype: str | None = None) -> routes.RouteContext:
    """The record's context as a Mac of ``tier`` would see it; ``dtype``: the
    features' (a neighbour query's coordinates are float32 whatever it is)."""
    architecture, macos = TIERS[tier]
    caps = diagnostics.metal_capabilities(architecture, macos)
    fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in record.items() if k in _FIELDS}
    fields.update(backend="metal", tier=caps["tier"], tensor_ops=caps["tensor_ops"])
    if _query(record):
        fields.update(map_kind="neighbors", dtype="float32", kernel_size=None, direction=record["op"])
    elif dtype is not None:
        fields["dtype"] = dtype
    return routes.RouteContext(**fields)


def plan(records: list[dict], tier: str, dtype: str | None = None) -> dict:
    """Per route: calls and multiply-adds; and the shares by kind of kernel
    (``matrix``: simdgroup matrices / TensorOps, ``scalar``: other Metal
    kernels, ``cpu``: off the GPU, with the fallback reasons). Neighbour
    queries (no multiply-adds) are counted per route under ``queries``."""
    by_route: dict[str, dict] = defaultdict(lambda: {"calls": 0, "macs": 0, "kind": ""})
    kinds = {"matrix": 0, "scalar": 0, "cpu": 0}
    fallbacks: dict[str, int] = defaultdict(int)
    queries: dict[str, dict] = defaultdict(lambda: {"calls": 0, "kind": ""})
    convs = 0
    for r in records:
        if _query(r):
            sel = routes.select(mac_context(r, tier))  # a CPU route serves every query
            row = queries[sel.route.name]
            row["calls"] += 1
            row["kind"] = "cpu" if sel.fallback else "gpu"  # a Metal context: off the GPU only by fallback
            if sel.fallback:
                fallbacks[sel.fallback] += 1
            continue
        convs += 1
        try:
            sel = routes.select(mac_context(r, tier, dtype))
        except ValueError as e:  # a context no route of any backend accepts
            warnings.warn(f"Mac plan: a {r['op']} call is left out: {e}", RuntimeWarning, stacklevel=2)
            continue
        route, macs = sel.route, multiply_adds(r)
        kind = "cpu" if sel.fallback else "matrix" if route.matrix_unit else "scalar"
        row = by_route[route.name]
        row["calls"] += 1
        row["macs"] += macs
        row["kind"] = kind
        kinds[kind] += macs
        if sel.fallback:
            fallbacks[sel.fallback] += 1
    total = sum(kinds.values()) or 1
    return {
        "tier": tier, "dtype": dtype, "calls": convs, "multiply_adds": sum(kinds.values()),
        "share": {k: v / total for k, v in kinds.items()},
        "routes": dict(sorted(by_route.items(), key=lambda kv: -kv[1]["macs"])),
        "queries": dict(sorted(queries.items(), key=lambda kv: -kv[1]["calls"])),
        "fallbacks": dict(fallbacks),
    }


def render(p: dict) -> str:
    total = p["multiply_adds"] or 1
    s = p["share"]
    lines = [
        f"Mac tier {p['tier']} ({', '.join(TIERS[p['tier']])}), features {p['dtype'] or 'as recorded'}: "
        f"{p['calls']} convolution calls, {p['multiply_adds'] / 1e9:.2f} G multiply-adds",
        f"  matrix units {s['matrix']:.1%}   scalar Metal kernels {s['scalar']:.1%}   off the GPU {s['cpu']:.1%}",
        "",
        f"  {'route':<32} {'kind':<7} {'calls':>6} {'share':>7}",
    ]
    for name, row in p["routes"].items():
        lines.append(f"  {name:<32} {row['kind']:<7} {row['calls']:>6} {row['macs'] / total:>7.1%}")
    if p.get("queries"):
        lines += ["", f"  {'neighbour queries':<32} {'on':<7} {'calls':>6}"]
        lines += [f"  {name:<32} {row['kind']:<7} {row['calls']:>6}" for name, row in p["queries"].items()]
    for why, n in p["fallbacks"].items():
        lines.append(f"  fallback x{n}: {why}")
    return "\n".join(lines)
