"""The NEON path of the CPU kernels, executed.

tests/neon/kernel_test.cpp (a standalone program: the kernel sources, the
thread pool and MLX's header-only half types, no MLX library) is compiled
for the NEON path and run: natively on an arm64 host, else with Debian's
aarch64 cross compiler (g++-aarch64-linux-gnu) under qemu-user. It checks
every kernel against a double-precision reference and bitwise equality
across thread counts. The binary is cached by the hash of its sources.
"""

import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

import mlx
import pytest

from conftest import cpu_kernel_sources

ROOT = Path(__file__).resolve().parent.parent
# Every per-ISA kernel file; the norms and Adam are compiled only here (their
# own tests run them on arm64 hosts).
SOURCES = cpu_kernel_sources() + [ROOT / "src/core/threadpool.cpp", ROOT / "tests/neon/kernel_test.cpp"]
HEADERS = sorted((ROOT / "src/cpu").glob("*.h")) + [ROOT / "src/core/threadpool.h"]
CACHE = ROOT / "build" / "neon-kernel-test"


def _toolchain():
    """(compiler command, runner prefix), or a reason to skip."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return [os.environ.get("CXX", "c++")], []
    missing = [t for t in ("aarch64-linux-gnu-g++", "qemu-aarch64") if shutil.which(t) is None]
    if missing:
        return (
            f"{' and '.join(missing)} not installed (Debian: apt-get install "
            "g++-aarch64-linux-gnu qemu-user)"
        )
    return ["aarch64-linux-gnu-g++", "-static"], ["qemu-aarch64"]


def test_neon_kernels_against_reference():
    tools = _toolchain()
    if isinstance(tools, str):
        pytest.skip(tools)
    compiler, runner = tools
    include = Path(list(mlx.__path__)[0]) / "include"
    digest = hashlib.sha256()
    for f in SOURCES + HEADERS:
        digest.update(f.read_bytes())
    digest.update(" ".join(compiler).encode())
    binary = CACHE / f"kernel_test-{digest.hexdigest()[:16]}"
    if not binary.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_suffix(f".tmp{os.getpid()}")
        cmd = [
            *compiler, "-std=c++20", "-O2", "-ffp-contract=off", "-DLATTICE_ISA_ID=3", "-DLATTICE_ISA_NAME=neon",
            f"-I{ROOT / 'src'}", f"-I{include}", *map(str, SOURCES), "-o", str(tmp), "-lpthread",
        ]
        build = subprocess.run(cmd, capture_output=True, text=True)
        assert build.returncode == 0, build.stderr[-4000:]
        tmp.replace(binary)
    run = subprocess.run([*runner, str(binary)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert run.stdout.strip().startswith("neon: ") and ", 0 failures" in run.stdout
