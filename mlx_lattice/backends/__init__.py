"""The backends: ``cpu``, ``metal`` and ``cuda``, one object each behind one
interface (:class:`base.Backend`; CPU and Metal share the extension's
implementation, :class:`native.NativeBackend`), and the one function that
says which of them runs a call (:func:`current`).

The GPU backends are imported on first use: a machine without the GPU never
loads their modules.
"""

from __future__ import annotations

import importlib

import mlx.core as mx

from .base import Backend, Views
from .build import build_info, metal_libraries
from .cpu import CpuBackend

NAMES = ("cpu", "metal", "cuda")
CPU = CpuBackend()
_LOADED: dict[str, Backend] = {}


def get(name: str) -> Backend:
    """The backend object of ``name``."""
    if name == "cpu":
        return CPU
    if name not in NAMES:
        raise ValueError(f"backend must be one of {NAMES}, got {name!r}")
    backend = _LOADED.get(name)
    if backend is None:
        # A GPU backend's modules load on first use only.
        backend = _LOADED[name] = importlib.import_module(f".{name}", __name__).BACKEND
    return backend


def current(stream=None) -> Backend:
    """The backend a call on ``stream`` (default: MLX's default device) runs
    on, before any fallback: the CPU for the CPU device; for the GPU, Metal
    where MLX runs Metal, CUDA where it runs CUDA."""
    device = stream.device if stream is not None else mx.default_device()
    if device.type == mx.cpu:
        return CPU
    for name in ("metal", "cuda"):
        if get(name).available():
            return get(name)
    return CPU


def executing(stream=None) -> tuple[Backend, str | None]:
    """(the backend that runs a call, why it left the device or None): a GPU
    this install cannot drive (no Metal kernels) runs the call on the CPU,
    on record."""
    backend = current(stream)
    reason = backend.unusable_reason()
    return (CPU, reason) if reason else (backend, None)


def capability_tier(name: str) -> str:
    """A short description of the device's capabilities, per backend."""
    return get(name).tier()


__all__ = ["Backend", "CPU", "NAMES", "Views", "build_info", "capability_tier", "current", "executing",
           "get", "metal_libraries"]
