"""Route diagnostics: what every convolution call chose and why, and how
every map was built.

``with mlx_lattice.diagnostics.record() as log: ...`` collects one dict per
convolution call; ``record(maps=True)`` also the map records (``op ==
"map"``: a coordinate table, support or relation built, by which route, its
sizes and host synchronisations; see :func:`map_record`).
``MLX_LATTICE_ROUTE_LOG=<path>`` appends every record, of both kinds, as a
JSON line. A convolution record's ``choice`` says where its route came from
(``static`` order, the route ``tuner``, the tuning ``cache``, or ``forced``
by name), with ``timings_ms``, ``variant`` and ``tune_note`` (docs/tuning.md).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import threading
from pathlib import Path

import mlx.core as mx

from . import _ext

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
            rows.append(
                (
                    r["op"], r["map_kind"], r["route"], r["backend"], r["dtype"], str(r["k"]),
                    f"{r['c_in']}->{r['c_out']}", str(r["n_out"]), str(r["edges"]),
                )
            )
        return format_table(rows)


    def why(self) -> str:
        """Each convolution call's route, and why each other route of the
        same backend for that pass was not taken."""
        out = []
        for r in self:
            if r["op"] == "map":
                continue
            out.append(f"{r['op']} ({r['map_kind']}, {r['dtype']}, K={r['k']}, "
                       f"{r['c_in']}->{r['c_out']}, {r['direction']}): {r['route']}")
            family = r["route"].split(".")[0] + "."
            out += [f"  not {x['route']}: {x['reason']}" for x in r.get("rejected", [])
                    if x["route"].startswith(family) and not x["reason"].startswith("route serves")]
            tuned = _tuning_line(r)
            if tuned:
                out.append(tuned)
        return "\n".join(out)


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


def emit(entry: dict) -> None:
    is_map = entry.get("op") == "map"
    with _lock:
        for log, maps in _active:
            if maps or not is_map:
                log.append(entry)
        path = os.environ.get("MLX_LATTICE_ROUTE_LOG")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(entry) + "\n")


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


# TensorOps need an Apple10-family GPU (architecture generation 17 and later)
# and macOS 26.2: MLX gates its own neural-accelerator kernels there, since
# matmuls built for earlier releases return wrong results.
TENSOR_OPS_GENERATION = 17
TENSOR_OPS_MACOS = (26, 2)


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)


def _gpu_architecture() -> str:
    if not mx.metal.is_available():
        return "unknown"
    try:
        return str(mx.device_info(mx.gpu).get("architecture", "unknown"))
    except Exception:  # an MLX whose device_info does not know the GPU
        return "unknown"


def metal_capabilities(architecture: str | None = None, macos: str | None = None) -> dict:
    """GPU generation, macOS version and TensorOps availability of a Mac.

    TensorOps (Metal 4 inline tensor operations on the GPU's neural
    accelerators) need an Apple10-family GPU (architecture generation 17 and
    later) and macOS 26.2. Arguments override detection, for tests and for
    asking what another machine would do. ``tensor_ops_reason`` says why not.
    """
    if architecture is None:
        architecture = _gpu_architecture()
    if macos is None:
        macos = platform.mac_ver()[0] or "unknown"
    digits = "".join(ch for ch in architecture.split("_g")[-1] if ch.isdigit()) if "_g" in architecture else ""
    generation = int(digits) if digits else 0
    version = _version_tuple(macos)
    need = ".".join(map(str, TENSOR_OPS_MACOS))
    if architecture == "unknown":
        why = "no Metal GPU detected"
    elif generation < TENSOR_OPS_GENERATION:
        why = f"GPU {architecture} is before Apple10 (generation {TENSOR_OPS_GENERATION})"
    elif not version or version < TENSOR_OPS_MACOS:
        why = f"macOS {macos} is before {need}"
    else:
        why = None
    tensor_ops = why is None
    tier = f"metal:{architecture}:macos-{macos}:tensorops={'yes' if tensor_ops else 'no'}"
    return {"architecture": architecture, "generation": generation, "macos": macos,
            "tensor_ops": tensor_ops, "tensor_ops_reason": why, "tier": tier}


# ------------------------------------------------------------ this build
def _package_dir() -> Path:
    from . import _ext

    return Path(_ext.__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def build_info() -> dict:
    """What CMake built (``build_info.json`` next to the extension): whether
    each Metal library was built and, if not, why."""
    path = _package_dir() / "build_info.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {"system": "unknown", "metal_built": False, "tensorops_built": False,
                "metal_reason": f"{path} is missing (an install from an older build)",
                "tensorops_reason": f"{path} is missing (an install from an older build)"}


def metal_libraries() -> dict:
    """Each Metal library of this install: its path, whether it is there,
    and why not. Keys ``metal`` (mlx_lattice.metallib) and ``tensorops``."""
    from . import _ext

    info = build_info()
    out = {}
    for key, name, compiled_in in (
        ("metal", "mlx_lattice.metallib", _ext.metal_available()),
        ("tensorops", "mlx_lattice_tensorops.metallib", _ext.metal_tensor_ops_kernels()),
    ):
        path = _package_dir() / name
        if not info.get(f"{key}_built"):
            reason = info.get(f"{key}_reason") or "not built"
        elif not path.is_file():
            reason = f"{name} is missing from {path.parent}"
        elif not compiled_in:
            reason = f"the extension was compiled without {name}"
        else:
            reason = None
        out[key] = {"path": str(path), "found": path.is_file(), "usable": reason is None, "reason": reason}
    return out


def metal_unavailable_reason() -> str | None:
    """None when this install can run its Metal kernels, else why not."""
    lib = metal_libraries()["metal"]
    return None if lib["usable"] else f"mlx_lattice.metallib unavailable: {lib['reason']}"


def backend_fallback(backend: str) -> str | None:
    """Why a call on ``backend`` must run on the CPU instead (None: it need not).

    The GPU is MLX's default device but this install has no Metal kernels
    (for example, built without the Metal toolchain): the call runs on the
    CPU and its route record says so in ``fallback``.
    """
    if backend != "metal":
        return None
    reason = metal_unavailable_reason()
    return None if reason is None else f"{reason}; running on the CPU"


def tensor_ops_available() -> tuple[bool, str | None]:
    """Whether the TensorOps routes can run here, and why not."""
    caps = metal_capabilities()
    if not caps["tensor_ops"]:
        return False, caps["tensor_ops_reason"]
    lib = metal_libraries()["tensorops"]
    if not lib["usable"]:
        return False, f"mlx_lattice_tensorops.metallib unavailable: {lib['reason']}"
    return True, None


def capability_tier(backend: str) -> str:
    """A short description of the executing device's capabilities.

    On Metal, a GPU that could run TensorOps under an install without the
    TensorOps library reads ``tensorops=no (not in this build)``, so that
    the route log says why those routes were not taken.
    """
    if backend == "metal":
        caps = metal_capabilities()
        if caps["tensor_ops"] and not metal_libraries()["tensorops"]["usable"]:
            return caps["tier"].replace("tensorops=yes", "tensorops=no (not in this build)")
        return caps["tier"]
    if backend == "cuda":
        return "cuda"
    return f"cpu:{_ext.cpu_isa()}"
