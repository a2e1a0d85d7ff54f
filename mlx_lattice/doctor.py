"""``python -m mlx_lattice doctor``: what this install can run on this machine.

Prints versions, the backends the machine has and whether this build can use
them, the Metal libraries (with paths) and why one is missing, the GPU
capability tier, the CPU kernels' instruction-set path and threads, the heap
settings applied at load (MLX_LATTICE_MALLOC_TUNING), and the route a typical
layer takes here. Exits 1 when the machine has a backend the
build cannot use (a Mac GPU but no usable mlx_lattice.metallib).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sys

import mlx.core as mx

from . import __version__, _ext, backends, diagnostics, routes

# The layer the route line describes: a submanifold 3x3x3 convolution,
# 64 -> 64 channels, float32, on 100k voxels of a surface-like scene (about 9
# active neighbours per voxel, as in LiDAR sweeps and meshes).
TYPICAL_LAYER = dict(op="subm_conv3d", map_kind="submanifold", dtype="float32",
                     kernel_size=(3, 3, 3), c_in=64, c_out=64, n_in=100_000,
                     n_out=100_000, edges=900_000)

# MLX's backend packages (extras of the mlx wheel).
MLX_BACKEND_PACKAGES = ("mlx-metal", "mlx-cpu", "mlx-cuda-13", "mlx-cuda-12", "mlx-cuda")


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_backends() -> dict:
    """The accelerators MLX sees here (what the machine has, as far as the
    installed MLX can tell)."""
    return {name: backends.get(name).available() for name in ("metal", "cuda")}


def nvidia_driver_present() -> bool:
    """An NVIDIA driver on a Linux machine (so MLX's CUDA backend could run)."""
    return sys.platform.startswith("linux") and os.path.exists("/proc/driver/nvidia/version")


def cpu_isa() -> str:
    """The CPU kernels' instruction-set path, and the paths this build carries."""
    native = " (-march=native build)" if _ext.CPU_NATIVE_BUILD else ""
    mine = " (those this CPU runs)" if _ext.CPU_PATHS_BUILT == "native" else ""
    return f"{_ext.cpu_isa()}{native}; built: {', '.join(_ext.built_cpu_isas())}{mine}"


def typical_route(backend: str) -> dict:
    """Route selection for TYPICAL_LAYER on ``backend`` as the ops would do it
    (without recording it in the route log)."""
    fallback = backends.get(backend).unusable_reason()
    effective = "cpu" if fallback else backend
    fields = dict(TYPICAL_LAYER)
    ctx = routes.context(fields.pop("op"), effective, **fields)
    sel = routes.select(ctx)
    return {"layer": "subm_conv3d 3x3x3, 64->64 channels, float32, 100k voxels",
            "backend": sel.route.backend, "route": sel.route.name,
            "fallback": fallback or sel.fallback}


def collect() -> dict:
    """Everything the report shows, as a dict (``--json`` prints it)."""
    info = diagnostics.build_info()
    has = machine_backends()
    libs = diagnostics.metal_libraries()
    metal_reason = diagnostics.metal_unavailable_reason()
    tensor_ops, tensor_ops_reason = diagnostics.tensor_ops_available()
    caps = diagnostics.metal_capabilities()
    default = backends.current().name

    usable = {
        "cpu": {"machine": True, "usable": True, "reason": None},
        "metal": {"machine": has["metal"], "usable": has["metal"] and metal_reason is None,
                  "reason": metal_reason if has["metal"] else "no Metal GPU visible to MLX"},
        "cuda": {"machine": has["cuda"], "usable": has["cuda"],
                 "reason": None if has["cuda"] else "MLX's CUDA backend is not installed or sees no GPU"},
    }
    problems, notes = [], []
    if has["metal"] and metal_reason is not None:
        problems.append(
            f"this Mac has a Metal GPU but the build cannot use it ({metal_reason}); "
            "convolutions run on the CPU. Install Xcode and its Metal Toolchain "
            "(xcodebuild -downloadComponent MetalToolchain), then reinstall mlx_lattice"
        )
    if not has["cuda"] and nvidia_driver_present():
        notes.append(
            "an NVIDIA driver is present but MLX runs without CUDA: install the CUDA backend "
            "with `pip install -e \".[cuda]\"` (mlx[cuda13])"
        )
    if has["metal"] and caps["tensor_ops"] and not tensor_ops:
        notes.append(f"this GPU supports TensorOps but the build has none: {tensor_ops_reason}")

    return {
        "versions": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "mlx": mx.__version__,
            "mlx_built_against": info.get("mlx_version", "unknown"),
            "mlx_backend_packages": {p: v for p in MLX_BACKEND_PACKAGES if (v := _package_version(p))},
            "mlx_lattice": __version__,
            "nanobind": info.get("nanobind_version", "unknown"),
            "nanobind_abi": info.get("nanobind_abi", "unknown"),
        },
        "build": {k: info.get(k) for k in ("system", "deployment_target") if info.get(k)},
        "backends": usable,
        "default_backend": default,
        "metallibs": libs,
        "tensor_ops": {"available": tensor_ops, "reason": tensor_ops_reason},
        "gpu_tier": diagnostics.capability_tier(default) if backends.current() is not backends.CPU else
        (caps["tier"] if has["metal"] else "no GPU"),
        "cpu": {"isa": cpu_isa(), "threads": _ext.num_threads(), "heap": _ext.malloc_tuning()},
        "typical_route": typical_route(default),
        "problems": problems,
        "notes": notes,
    }


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def render(report: dict) -> str:
    v = report["versions"]
    pkgs = ", ".join(f"{k} {x}" for k, x in v["mlx_backend_packages"].items()) or "none"
    lines = [
        "mlx_lattice doctor",
        "",
        "versions",
        f"  mlx_lattice   {v['mlx_lattice']}",
        f"  mlx           {v['mlx']} (built against {v.get('mlx_built_against', 'unknown')}; "
        f"backend packages: {pkgs})",
        f"  nanobind      {v['nanobind']} ({v['nanobind_abi']})",
        f"  python        {v['python']} on {v['platform']}",
        "",
        "backends (machine has / build can use)",
    ]
    for name, b in report["backends"].items():
        line = f"  {name:<6} {_yes(b['machine']):<3} / {_yes(b['usable']):<3}"
        if b["reason"]:  # the CPU's is always None
            line += f"  {b['reason']}"
        lines.append(line)
    lines += [f"  default device: {report['default_backend']}", "", "metal libraries"]
    for key, lib in report["metallibs"].items():
        state = "found" if lib["usable"] else f"not usable: {lib['reason']}"
        lines.append(f"  {key:<9} {lib['path']}  ({state})")
    t = report["tensor_ops"]
    lines += [
        f"  TensorOps routes: {'available' if t['available'] else 'no (' + str(t['reason']) + ')'}",
        "",
        f"GPU capability tier: {report['gpu_tier']}",
        f"CPU: instruction set {report['cpu']['isa']}, {report['cpu']['threads']} threads",
        f"CPU heap: {report['cpu']['heap']}",
        "",
    ]
    r = report["typical_route"]
    lines.append(f"typical layer ({r['layer']}): {r['route']} on {r['backend']}")
    if r["fallback"]:
        lines.append(f"  fallback: {r['fallback']}")
    for n in report["notes"]:
        lines.append(f"note: {n}")
    for p in report["problems"]:
        lines.append(f"PROBLEM: {p}")
    lines.append("")
    lines.append("ok" if not report["problems"] else "the build cannot use this machine's GPU (exit 1)")
    return "\n".join(lines) + "\n"


def main(args) -> int:
    report = collect()
    if getattr(args, "json", False):
        print(json.dumps(report, indent=2))
    else:
        sys.stdout.write(render(report))
    return 1 if report["problems"] else 0
