"""Route diagnostics: what every convolution call chose and why, and how
every map was built.

``with mlx_lattice.diagnostics.record() as log: ...`` collects one dict per
convolution call and per neighbour query (``op`` ``knn`` or ``radius``,
mlx_lattice/neighbors.py); ``record(maps=True)`` also the map records (``op ==
"map"``: a coordinate table, support or relation built, by which route, its
sizes and host synchronisations; see :func:`map_record`).
``MLX_LATTICE_ROUTE_LOG=<path>`` appends every record, of both kinds, as a
JSON line (one write per line, so processes may share the file; a relative
path is taken from the working directory at each record; empty means no
file; a path that cannot be written is warned about once and skipped). A convolution record's ``choice`` says where its route came from
(``static`` order, the route ``tuner``, the tuning ``cache``, or ``forced``
by name), with ``timings_ms``, ``variant`` and ``tune_note`` (docs/tuning.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import warnings

from . import _files


_active: list[tuple["RouteLog", bool]] = []  # (log, whether it takes map records)
_lock = threading.Lock()


def format_table(rows: list[tuple[str, ...]]) -> str:
    """Rows of strings as aligned columns, the first row a header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for j, row in enumerate(rows):
        out.append("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


class RouteLog(list):
    """A list of route records with JSON and table renderings."""

    def to_json(self, indent=2) -> str:
        return json.dumps(list(self), indent=indent)

    def dump(self, path) -> None:
        with open(path, "w") as f:
            f.write(self.to_json())

    def table(self) -> str:
        rows = [("op", "map kind", "route", "backend", "dtype", "K", "C_in->C_out", "n_out", "edges")]
        for r in self:
            if r["op"] == "map":
                kind = f"{r['product']}" + (f" {r['map_kind']}" if r["map_kind"] else "")
                rows.append(("map", kind, r["route"], r["backend"], "-", str(r["k"]), "-",
                             str(r["n_out"]), str(r["edges"])))
                continue
            if r["op"] in NEIGHBOR_OPS:  # K: neighbours wanted; n_out: queries
                rows.append((r["op"], "-", r["route"], r["backend"], r["dtype"], str(r["k"]), "-",
                             str(r["n_out"]), "-"))
                continue
            rows.append(
                (
                    r["op"], r["map_kind"], r["route"], r["backend"], r["dtype"], str(r["k"]),
                    f"{r['c_in']}->{r['c_out']}", str(r["n_out"]), str(r["edges"]),
                )
            )
        return format_table(rows)


    def why(self) -> str:
        """Each convolution call's route, and why each other route for that
        pass on the call's device was not taken: a requirement it fails is
        said to be unmet, with the call's values (``requires K == 27, not
        met: k=8``). Routes of other backends, and of other passes, are
        left out; a call that left its GPU says so, with the reasons of
        that GPU's routes."""
        out = []
        for r in self:
            if r["op"] == "map":
                continue
            if r["op"] in NEIGHBOR_OPS:
                within = f", r={r['radius']:g}" if r["op"] == "radius" else ""
                out.append(f"{r['op']} (k={r['k']}{within}, {r['n_out']} queries, {r['n_in']} points): "
                           f"{r['route']}")
            else:
                out.append(f"{r['op']} ({r['map_kind']}, {r['dtype']}, K={r['k']}, "
                           f"{r['c_in']}->{r['c_out']}, {r['direction']}): {r['route']}")
            out += [f"  not {x['route']}: {x['reason']}" for x in r.get("rejected", [])
                    if not x["reason"].startswith(_OTHER_DEVICE_OR_PASS)]
            if r.get("fallback"):
                out.append(f"  ran on the CPU: {r['fallback']}")
            tuned = _tuning_line(r)
            if tuned:
                out.append(tuned)
        return "\n".join(out)


# Rejections why() leaves out: routes of another backend, or another pass
# (the wording of routes.Route.failed).
_OTHER_DEVICE_OR_PASS = ("backend is ", "route serves ")
# A neighbour query's record (mlx_lattice/neighbors.py): op and pass alike.
NEIGHBOR_OPS = ("knn", "radius")


_CHOICES = {
    "tuner": "chosen by the route tuner, measured in this process",
    "cache": "chosen from the route tuning cache",
    "forced": "named explicitly for this pass (mlx_lattice.tuning.force / MLX_LATTICE_ROUTE_<PASS>)",
}


def _tuning_line(r: dict) -> str | None:
    """Where a record's route came from, when not (only) the static order:
    the route tuner's ``choice``, variant and timings (docs/tuning.md)."""
    choice, note = r.get("choice"), r.get("tune_note")
    if choice in _CHOICES:
        text = _CHOICES[choice]
        if r.get("variant"):
            text += f"; variant {r['variant']}"
        if r.get("timings_ms"):
            times = sorted(r["timings_ms"].items(), key=lambda kv: kv[1])
            text += ": " + ", ".join(f"{k} {v:.3g} ms" for k, v in times)
        return "  " + text
    if note:
        return f"  static order ({note})"
    return None


@contextlib.contextmanager
def record(maps: bool = False):
    """Collect the route record of every convolution call in the block and,
    with ``maps``, the record of every map built in it."""
    log = RouteLog()
    item = (log, bool(maps))
    with _lock:
        _active.append(item)
    try:
        yield log
    finally:
        with _lock:
            _active.remove(item)


def listening() -> bool:
    """Whether a record emitted now goes anywhere (a ``record`` block or
    ``$MLX_LATTICE_ROUTE_LOG``)."""
    return bool(_active) or bool(_env_get(_LOG_KEY))


# The route log's variable, read as os.environ keeps it (os.environ.get
# encodes its key at every call, and this is asked for every product).
try:
    _env_get, _LOG_KEY = os.environ._data.get, os.environ.encodekey("MLX_LATTICE_ROUTE_LOG")
except AttributeError:  # an os.environ without its mapping of encoded keys
    _env_get, _LOG_KEY = os.environ.get, "MLX_LATTICE_ROUTE_LOG"


_log_warned: set = set()


def emit(entry: dict) -> None:
    is_map = entry.get("op") == "map"
    with _lock:
        for log, maps in _active:
            if maps or not is_map:
                log.append(entry)
        path = os.environ.get("MLX_LATTICE_ROUTE_LOG", "").strip()
        if path:
            try:
                _files.append_line(path, json.dumps(entry))
            except OSError as e:
                # a log that cannot be written must not stop the convolution
                # that reports to it: said once per path and error
                if (path, e.errno) not in _log_warned:
                    _log_warned.add((path, e.errno))
                    warnings.warn(f"MLX_LATTICE_ROUTE_LOG={path!r}: cannot append to it ({e}); "
                                  "records are not written there", RuntimeWarning, stacklevel=3)


MAP_PRODUCTS = ("table", "support", "relation")


def map_record(product: str, route: str, *, map_kind: str | None, n_in: int, n_out: int, k: int,
               edges: int, syncs: int | None, geometry=None, swapped: bool = False) -> dict:
    """Record one map built (``op == "map"``) and return the record.

    ``product``: ``table`` (a coordinate set hashed: n_in = n_out = its
    rows), ``support`` (the output coordinates of a strided or generative
    layer: n_out rows) or ``relation`` (its edges; ``swapped``: made from
    another relation with roles exchanged, no hashing). ``route``: the map
    route of the registry (``cpu.hash_map``, ``metal.hash_map``,
    ``cuda.hash_map``); ``syncs``: host synchronisations the build made
    (None where its builder does not count them); ``geometry``: (kernel
    size, stride, padding, dilation).
    """
    if product not in MAP_PRODUCTS:
        raise ValueError(f"product must be one of {MAP_PRODUCTS}, got {product!r}")
    size, stride, padding, dilation = geometry if geometry is not None else (None,) * 4
    entry = {
        "op": "map", "product": product, "route": route, "backend": route.split(".")[0],
        "map_kind": map_kind, "n_in": int(n_in), "n_out": int(n_out), "k": int(k), "edges": int(edges),
        "syncs": syncs, "swapped": bool(swapped), "kernel_size": size, "stride": stride,
        "padding": padding, "dilation": dilation,
    }
    emit(entry)
    return entry


# What the device can do and what this build holds: asked of the backends
# (mlx_lattice/backends/), which compute each once per process. Read from
# them on first use, so that importing this module loads no GPU backend.
_FROM_BACKENDS = {
    "build_info": ("build", "build_info"),
    "capability_tier": ("", "capability_tier"),
    "metal_libraries": ("build", "metal_libraries"),
    "TENSOR_OPS_GENERATION": ("metal", "TENSOR_OPS_GENERATION"),
    "TENSOR_OPS_MACOS": ("metal", "TENSOR_OPS_MACOS"),
    "metal_capabilities": ("metal", "metal_capabilities"),
    "metal_unavailable_reason": ("metal", "metal_unavailable_reason"),
    "tensor_ops_available": ("metal", "tensor_ops_available"),
}


def __getattr__(name: str):
    where = _FROM_BACKENDS.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module = importlib.import_module(".backends" + (f".{where[0]}" if where[0] else ""), __package__)
    return getattr(module, where[1])
