"""Which Metal route each convolution call of a recorded run would take on a
Mac of a given tier, and the share of the run's multiply-adds on matrix
units (simdgroup matrices or TensorOps), on the GPU's scalar kernels, and
off the GPU.

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


def load(path) -> list[dict]:
    """Convolution records from a RouteLog dump (a JSON list) or a route log
    of JSON lines; map records are left out."""
    text = Path(path).read_text()
    try:
        data = json.loads(text)
        records = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [r for r in records if r.get("op") != "map"]


def multiply_adds(record: dict) -> int:
    """Useful multiply-adds of a call: its edges (rows for a 1x1x1 product
    without a relation) times C_in / groups times C_out."""
    edges = record["edges"] or record["n_out"]
    return int(edges) * (int(record["c_in"]) // max(int(record.get("groups", 1)), 1)) * int(record["c_out"])


def mac_context(record: dict, tier: str, dtype: str | None = None) -> routes.RouteContext:
    architecture, macos = TIERS[tier]
    caps = diagnostics.metal_capabilities(architecture, macos)
    fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in record.items() if k in _FIELDS}
    fields.update(backend="metal", tier=caps["tier"], tensor_ops=caps["tensor_ops"])
    if dtype is not None:
        fields["dtype"] = dtype
    return routes.RouteContext(**fields)


def plan(records: list[dict], tier: str, dtype: str | None = None) -> dict:
    """Per route: calls and multiply-adds; and the shares by kind of kernel
    (``matrix``: simdgroup matrices / TensorOps, ``scalar``: other Metal
    kernels, ``cpu``: off the GPU, with the fallback reasons)."""
    by_route: dict[str, dict] = defaultdict(lambda: {"calls": 0, "macs": 0, "kind": ""})
    kinds = {"matrix": 0, "scalar": 0, "cpu": 0}
    fallbacks: dict[str, int] = defaultdict(int)
    for r in records:
        sel = routes.select(mac_context(r, tier, dtype))
        route, macs = sel.route, multiply_adds(r)
        kind = "cpu" if route.backend != "metal" else "matrix" if route.matrix_unit else "scalar"
        row = by_route[route.name]
        row["calls"] += 1
        row["macs"] += macs
        row["kind"] = kind
        kinds[kind] += macs
        if sel.fallback:
            fallbacks[sel.fallback] += 1
    total = sum(kinds.values()) or 1
    return {
        "tier": tier, "dtype": dtype, "calls": len(records), "multiply_adds": sum(kinds.values()),
        "share": {k: v / total for k, v in kinds.items()},
        "routes": dict(sorted(by_route.items(), key=lambda kv: -kv[1]["macs"])),
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
    for why, n in p["fallbacks"].items():
        lines.append(f"  fallback x{n}: {why}")
    return "\n".join(lines)
