"""MLX's macOS arm64 wheel (`mlx-metal`), fetched by pip and unpacked once.

Every Mac user of MLX installs this wheel. It ships Apple's metal-cpp, MLX's
Metal backend headers, MLX's own Metal kernel sources and `libmlx.dylib`,
which makes it the judge of our Mac-side code on any host: the macOS build
test (tests/macbuild/) configures against its CMake package, compiles
against its headers and links against its libmlx.dylib, and the strict
Metal pass is held to the kernels in it.

`root()` returns the unpacked wheel's top folder (holding `mlx/include`,
`mlx/lib`) for the MLX release installed here, or None with `reason()`
saying why (no network and no cached copy). Set `MLX_LATTICE_MLX_METAL_CACHE`
to keep the cache elsewhere than `build/mlx-metal/`.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLATFORM = "macosx_14_0_arm64"
_reason: list[str] = []


def release() -> str:
    """The MLX release the extension is built against (the one installed)."""
    from importlib.metadata import version

    return version("mlx")


def cache_dir() -> Path:
    env = os.environ.get("MLX_LATTICE_MLX_METAL_CACHE")
    return Path(env) if env else REPO / "build" / "mlx-metal"


def reason() -> str:
    return _reason[-1] if _reason else ""


@functools.lru_cache(maxsize=None)
def root(version: str | None = None) -> Path | None:
    version = version or release()
    base = cache_dir() / version
    done = base / ".unpacked"
    if done.exists():
        return base / "wheel"
    base.mkdir(parents=True, exist_ok=True)
    wheels = sorted(base.glob(f"mlx_metal-{version}-*{PLATFORM}.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               "--only-binary=:all:", "--platform", PLATFORM,
               f"mlx-metal=={version}", "-d", str(base)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wheels = sorted(base.glob(f"mlx_metal-{version}-*{PLATFORM}.whl"))
        if proc.returncode != 0 or not wheels:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            _reason.append(f"mlx-metal=={version} ({PLATFORM}) is not cached in {base} "
                           f"and pip could not fetch it: {tail[0]}")
            return None
    out = base / "wheel"
    with zipfile.ZipFile(wheels[-1]) as z:
        z.extractall(out)
    done.write_text(wheels[-1].name + "\n")
    return out


def include_dir(version: str | None = None) -> Path | None:
    r = root(version)
    return None if r is None else r / "mlx" / "include"


def kernels_dir(version: str | None = None) -> Path | None:
    inc = include_dir(version)
    return None if inc is None else inc / "mlx" / "backend" / "metal" / "kernels"


def libmlx(version: str | None = None) -> Path | None:
    r = root(version)
    return None if r is None else r / "mlx" / "lib" / "libmlx.dylib"


def cmake_dir(version: str | None = None) -> Path | None:
    """MLX's CMake package of the macOS wheel (MLXConfig.cmake, with Metal on
    and the wheel's include folders and libmlx.dylib as the `mlx` target)."""
    r = root(version)
    return None if r is None else r / "mlx" / "share" / "cmake" / "MLX"
