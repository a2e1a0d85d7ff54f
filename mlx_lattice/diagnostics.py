"""Route diagnostics: what every convolution call chose and why.

``with mlx_lattice.diagnostics.record() as log: ...`` collects one dict per
call; ``MLX_LATTICE_ROUTE_LOG=<path>`` appends each as a JSON line.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import threading

import mlx.core as mx

from . import _ext

_active: list["RouteLog"] = []
_lock = threading.Lock()


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
            rows.append(
                (
                    r["op"], r["map_kind"], r["route"], r["backend"], r["dtype"], str(r["k"]),
                    f"{r['c_in']}->{r['c_out']}", str(r["n_out"]), str(r["edges"]),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        out = []
        for j, row in enumerate(rows):
            out.append("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
            if j == 0:
                out.append("  ".join("-" * w for w in widths))
        return "\n".join(out)


@contextlib.contextmanager
def record():
    """Collect the route record of every convolution call in the block."""
    log = RouteLog()
    with _lock:
        _active.append(log)
    try:
        yield log
    finally:
        with _lock:
            _active.remove(log)


def emit(entry: dict) -> None:
    with _lock:
        for log in _active:
            log.append(entry)
        path = os.environ.get("MLX_LATTICE_ROUTE_LOG")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(entry) + "\n")


def metal_capabilities(architecture: str | None = None, macos: str | None = None) -> dict:
    """GPU generation, macOS version and TensorOps availability of a Mac.

    TensorOps (Metal 4 inline tensor operations on the GPU's neural
    accelerators) need an Apple10-family GPU (architecture generation 17 and
    later) and macOS 26. Arguments override detection, for tests and for
    asking what another machine would do.
    """
    if architecture is None:
        try:
            architecture = str(mx.metal.device_info().get("architecture", "unknown"))
        except Exception:  # no Metal device, or an MLX without device_info
            architecture = "unknown"
    if macos is None:
        macos = platform.mac_ver()[0] or "unknown"
    digits = "".join(ch for ch in architecture.split("_g")[-1] if ch.isdigit())
    generation = int(digits) if digits else 0
    try:
        major = int(macos.split(".")[0])
    except ValueError:
        major = 0
    tensor_ops = generation >= 17 and major >= 26
    tier = f"metal:{architecture}:macos-{macos}:tensorops={'yes' if tensor_ops else 'no'}"
    return {"architecture": architecture, "generation": generation, "macos": macos,
            "tensor_ops": tensor_ops, "tier": tier}


def capability_tier(backend: str) -> str:
    """A short description of the executing device's capabilities."""
    if backend == "metal":
        return metal_capabilities()["tier"]
    if backend == "cuda":
        return "cuda"
    return f"cpu:{_ext.cpu_isa()}"
