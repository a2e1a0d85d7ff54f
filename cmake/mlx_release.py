"""The MLX release the extension is built against, and the pins that follow.

The extension links libmlx and subclasses its C++ primitives, so it runs
only beside the MLX release whose headers it was compiled with; and it hands
arrays to ``mlx.core`` through nanobind, whose ABI must be the one that MLX
release was built with. So a build takes the MLX already installed in the
environment it installs into, when that release is supported (a source
install then forces no upgrade or downgrade), else the newest supported
release, and the package's dependencies pin exactly the release it built
against.

A scikit-build-core dynamic-metadata provider (pyproject.toml names it):
``get_requires_for_dynamic_metadata`` adds MLX and the matching nanobind to
the build requirements; ``dynamic_metadata`` fills ``dependencies`` and
``optional-dependencies``, substituting ``{mlx}`` and ``{nanobind}`` with
the releases found in the build environment.
"""

from __future__ import annotations

import os
import subprocess
import sys

# Supported MLX minor releases -> the nanobind release with their ABI.
NANOBIND = {"0.31": "2.12.0", "0.32": "3.1.0"}
# Built against where the target environment has no supported MLX.
NEWEST = "0.32.4"

_PROBE = (
    "import importlib.metadata as m\n"
    "try:\n    print(m.version('mlx'))\n"
    "except m.PackageNotFoundError:\n    pass\n"
)


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def installed_mlx() -> str | None:
    """The MLX release in the environment being installed into, if any.

    pip runs build hooks with that environment's interpreter, hiding its
    site-packages behind PYTHONPATH / PYTHONNOUSERSITE; a child interpreter
    without them sees it again. (Other front ends may build in an
    environment of their own: nothing is found there, and the newest
    supported release is used.) MLX_LATTICE_MLX overrides.
    """
    forced = os.environ.get("MLX_LATTICE_MLX")
    if forced:
        return forced
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    try:
        out = subprocess.run(
            [sys.executable, "-I", "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out or None


def target_mlx() -> str:
    found = installed_mlx()
    return found if found and _minor(found) in NANOBIND else NEWEST


def get_requires_for_dynamic_metadata(settings=None) -> list[str]:
    mlx = target_mlx()
    # The build needs a libmlx.so to link against: on Linux the CPU backend
    # package carries one, whichever backend the package runs with later.
    return [
        f"mlx=={mlx}",
        f"mlx[cpu]=={mlx}; sys_platform == 'linux'",
        f"nanobind=={NANOBIND[_minor(mlx)]}",
    ]


def built_with() -> dict[str, str]:
    """The MLX and nanobind releases in the build environment (what CMake
    compiles against)."""
    import importlib.metadata

    return {name: importlib.metadata.version(name) for name in ("mlx", "nanobind")}


def fill(value, releases: dict[str, str]):
    """``value`` (a string, list or table of them) with ``{mlx}`` and
    ``{nanobind}`` replaced."""
    if isinstance(value, str):
        for name, version in releases.items():
            value = value.replace("{" + name + "}", version)
        return value
    if isinstance(value, list):
        return [fill(v, releases) for v in value]
    return {k: fill(v, releases) for k, v in value.items()}


def dynamic_metadata(field: str, settings: dict, project=None):
    if set(settings) != {"value"}:
        raise RuntimeError(f"mlx_release: {field} takes one setting, 'value', got {sorted(settings)}")
    return fill(settings["value"], built_with())
