"""The Metal backend: maps built by the programs of src/metal/map_build.cpp
(``maps``), neighbour queries by those of src/metal/neighbors.cpp
(``neighbors``, loaded on the first query) and products run by the Metal
route tables of src/metal/, on a Mac whose GPU is MLX's default device and
whose install has the Metal kernels."""

from __future__ import annotations

import platform

import mlx.core as mx

from ... import _ext
from .. import build
from ..native import NativeBackend
from . import maps

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


def gpu_architecture() -> str:
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
    later) and macOS 26.2. Arguments override detection, for asking what
    another machine would do; without them, this machine's (computed once:
    ``BACKEND.capabilities()``). ``tensor_ops_reason`` says why not.
    """
    if architecture is None and macos is None:
        return dict(BACKEND.capabilities())
    return _capabilities(architecture, macos)


def _capabilities(architecture: str | None, macos: str | None) -> dict:
    if architecture is None:
        architecture = gpu_architecture()
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


def metal_unavailable_reason() -> str | None:
    """None when this install can run its Metal kernels, else why not."""
    lib = build.metal_libraries()["metal"]
    return None if lib["usable"] else f"mlx_lattice.metallib unavailable: {lib['reason']}"


def tensor_ops_available() -> tuple[bool, str | None]:
    """Whether the TensorOps routes can run here, and why not."""
    caps = metal_capabilities()
    if not caps["tensor_ops"]:
        return False, caps["tensor_ops_reason"]
    lib = build.metal_libraries()["tensorops"]
    if not lib["usable"]:
        return False, f"mlx_lattice_tensorops.metallib unavailable: {lib['reason']}"
    return True, None


class MetalBackend(NativeBackend):
    name = "metal"
    map_route = "metal.hash_map"
    neighbor_routes = ("metal.knn", "metal.radius")  # the route table of src/metal/neighbors.cpp

    fused_norm_switch = "FUSED_ON_METAL"

    def __init__(self):
        self._facts = None

    def _probe(self) -> bool:
        return bool(mx.metal.is_available())

    def refresh(self) -> None:
        """Forget the device facts and what the install holds (they are
        asked again on next use)."""
        self._facts = None
        build.forget()
        self.__dict__.pop("_available", None)

    def capabilities(self) -> dict:
        if self._facts is None:
            self._facts = _capabilities(None, None)
        return self._facts

    def unusable_reason(self):
        reason = metal_unavailable_reason()
        return None if reason is None else f"{reason}; running on the CPU"

    def tier(self) -> str:
        """On a GPU that could run TensorOps under an install without the
        TensorOps library: ``tensorops=no (not in this build)``, so that the
        route log says why those routes were not taken."""
        caps = self.capabilities()
        if caps["tensor_ops"] and not build.metal_libraries()["tensorops"]["usable"]:
            return caps["tier"].replace("tensorops=yes", "tensorops=no (not in this build)")
        return caps["tier"]

    def tensor_ops(self) -> bool:
        """Whether this GPU and this build run the TensorOps routes."""
        return bool(self.capabilities()["tensor_ops"] and _ext.metal_tensor_ops_kernels())

    def fused_norm_available(self):
        # the norm's Metal kernels are in this build
        return bool(_ext.metal_available())

    def table(self, coords, trusted=False):
        return maps.MetalTable(coords)

    def support(self, table, geometry, generative):
        fn = maps.generative_support if generative else maps.forward_support
        return fn(table, geometry)

    def relation(self, table, out_coords, geometry, transposed, kind, out_table=None):
        native, plans = maps.build(table, out_coords, geometry, transposed, kind)
        return native, plans, None, None

    def syncs(self):
        return maps.SYNCS

    def neighbor_queries(self):
        from . import neighbors  # loaded on the first query only

        return neighbors


BACKEND = MetalBackend()
