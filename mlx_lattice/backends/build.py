"""What this install holds: the extension's build record and the Metal
libraries beside it."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from .. import _ext


def package_dir() -> Path:
    return Path(_ext.__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def build_info() -> dict:
    """What CMake built (``build_info.json`` next to the extension): whether
    each Metal library was built and, if not, why."""
    path = package_dir() / "build_info.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {"system": "unknown", "metal_built": False, "tensorops_built": False,
                "metal_reason": f"{path} is missing (an install from an older build)",
                "tensorops_reason": f"{path} is missing (an install from an older build)"}


def metal_libraries() -> dict:
    """Each Metal library of this install: its path, whether it is there,
    and why not. Keys ``metal`` (mlx_lattice.metallib) and ``tensorops``.
    Looked up on disk once per process (the build writes them, the package
    never does: :func:`forget` asks again)."""
    return {key: dict(lib) for key, lib in _metal_libraries().items()}


def forget() -> None:
    """Look the Metal libraries up again on next use."""
    _metal_libraries.cache_clear()


@functools.lru_cache(maxsize=None)
def _metal_libraries() -> dict:
    info = build_info()
    out = {}
    for key, name, compiled_in in (
        ("metal", "mlx_lattice.metallib", _ext.metal_available()),
        ("tensorops", "mlx_lattice_tensorops.metallib", _ext.metal_tensor_ops_kernels()),
    ):
        path = package_dir() / name
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
