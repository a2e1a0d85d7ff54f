"""Compiling .metal sources into shared objects and launching their kernels.

Build products are cached on disk under a key made of the rewritten source,
the shim and runtime sources, the flags and the compiler version; in one
Python process every source is scanned and loaded once.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from . import source as src
from . import strict

HERE = Path(__file__).resolve().parent
INCLUDE = HERE / "include"
RUNTIME = HERE / "runtime.cpp"
ROOT = HERE.parents[2]

CXX = os.environ.get("MLX_LATTICE_HARNESS_CXX", os.environ.get("CXX", "g++"))
COMMON_FLAGS = [
    "-std=c++20",
    "-fPIC",
    "-gdwarf-4",
    "-fno-omit-frame-pointer",
    "-fno-strict-aliasing",
    "-U_FORTIFY_SOURCE",
    "-fvisibility=hidden",
    "-Wno-attributes",
    f"-I{INCLUDE}",
]
# Metal has no double: unsuffixed floating literals are float.
KERNEL_FLAGS = ["-O1", "-fsingle-precision-constant", "-include", "metal_stdlib"]
SCAN_FLAGS = ["-E", "-x", "c++", "-std=c++20", "-DMH_SCAN=1", f"-I{INCLUDE}"]
# __METAL_VERSION__ is per file: the -std the CMake build compiles it with
# (strict.version_for). Of MSL 4.0's additions only the tensor subset in
# include/mh/tensor.h is emulated.
METAL_DEFINES = ["-D__METAL__=1", "-DMLX_LATTICE_HARNESS=1"]

SCHEDULES = {"forward": 0, "reverse": 1, "random": 2}
THREADGROUP_MEMORY_LIMIT = 32 * 1024
MAX_THREADS_PER_THREADGROUP = 1024

_lock = threading.RLock()
_programs: dict[tuple, "Program"] = {}
_runtime_object: Path | None = None


class HarnessError(RuntimeError):
    """The harness could not build or load a kernel source."""


def cache_dir() -> Path:
    d = os.environ.get("MLX_LATTICE_HARNESS_CACHE")
    path = Path(d) if d else ROOT / "build" / "metal_harness"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _compiler_version() -> str:
    try:
        out = subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise HarnessError(f"no C++ compiler ({CXX}) for the Metal harness: {e}") from e
    return out.stdout.splitlines()[0] if out.stdout else CXX


def _shim_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(INCLUDE.rglob("*")) + [RUNTIME]:
        if p.is_file():
            h.update(p.relative_to(HERE).as_posix().encode())
            h.update(p.read_bytes())
    h.update(" ".join(COMMON_FLAGS + KERNEL_FLAGS).encode())
    h.update(_compiler_version().encode())
    return h.hexdigest()[:16]


def _compile(cmd: list[str], what: str) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise HarnessError(f"compiling {what} failed:\n{res.stderr[-6000:]}")


def runtime_object() -> Path:
    """The executor, compiled once per shim version."""
    global _runtime_object
    with _lock:
        if _runtime_object and _runtime_object.exists():
            return _runtime_object
        out = cache_dir() / f"runtime-{_shim_digest()}.o"
        if not out.exists():
            fd, tmp = tempfile.mkstemp(suffix=".o", dir=out.parent)
            os.close(fd)
            _compile([CXX, *COMMON_FLAGS, "-O2", "-c", str(RUNTIME), "-o", tmp], "the harness runtime")
            os.replace(tmp, out)  # atomic: concurrent sessions may race
        _runtime_object = out
        return out


def metal_version(path: Path) -> int:
    try:
        return strict.version_for(Path(path))
    except strict.StrictError as e:
        raise HarnessError(str(e)) from e


def scan(path: Path, include_dirs=(), version: int | None = None) -> str:
    """Preprocess a .metal file with the MSL headers expanding to nothing.
    `include_dirs` are searched for the source's own headers (after the
    shim); `version` overrides the language version the build gives it."""
    version = metal_version(path) if version is None else int(version)
    res = subprocess.run(
        [CXX, *SCAN_FLAGS, *[f"-I{d}" for d in include_dirs], *METAL_DEFINES,
         f"-D__METAL_VERSION__={version}", str(path)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise HarnessError(f"preprocessing {path} failed:\n{res.stderr[-4000:]}")
    return res.stdout


def parse(path: Path) -> src.Unit:
    try:
        return src.process(scan(path))
    except src.SourceError as e:
        raise HarnessError(f"{path}: {e}") from e


# ---------------------------------------------------------------- ctypes ABI


class BufferDesc(ctypes.Structure):
    _fields_ = [
        ("host", ctypes.c_void_p),
        ("nbytes", ctypes.c_uint64),
        ("name", ctypes.c_char_p),
        ("bound", ctypes.c_int32),
        ("alias", ctypes.c_int32),
    ]


class LaunchDesc(ctypes.Structure):
    _fields_ = [
        ("kernel", ctypes.c_char_p),
        ("buffers", ctypes.POINTER(BufferDesc)),
        ("tg_sizes", ctypes.POINTER(ctypes.c_uint64)),
        ("n_buffers", ctypes.c_int32),
        ("n_tg_buffers", ctypes.c_int32),
        ("groups", ctypes.c_uint32 * 3),
        ("threads", ctypes.c_uint32 * 3),
        ("grid", ctypes.c_uint32 * 3),
        ("use_grid", ctypes.c_int32),
        ("schedule", ctypes.c_int32),
        ("strict", ctypes.c_int32),
        ("seed", ctypes.c_uint64),
        ("timeout_s", ctypes.c_double),
        ("tg_limit", ctypes.c_uint32),
        ("max_threads", ctypes.c_uint32),
        ("status", ctypes.c_int32),
        ("n_pcs", ctypes.c_int32),
        ("pcs", ctypes.c_uint64 * 24),
        ("error", ctypes.c_char * 4096),
        ("matrix_macs", ctypes.c_uint64),
        ("tg_bytes", ctypes.c_uint64),
        ("n_constants", ctypes.c_int32),
        ("constant_index", ctypes.POINTER(ctypes.c_int32)),
        ("constant_data", ctypes.POINTER(ctypes.c_uint8)),
    ]


class Program:
    """One compiled .metal source."""

    def __init__(self, path: Path, unit: src.Unit, so_path: Path):
        self.path = path
        self.unit = unit
        self.so_path = so_path
        self.lib = ctypes.CDLL(str(so_path))
        self.lib.mh_run.argtypes = [ctypes.c_void_p]
        self.lib.mh_run.restype = ctypes.c_int
        self.lib.mh_kernel_count.restype = ctypes.c_int
        self.lib.mh_kernel_name.restype = ctypes.c_char_p
        self.lib.mh_kernel_name.argtypes = [ctypes.c_int]
        names = {
            self.lib.mh_kernel_name(i).decode() for i in range(self.lib.mh_kernel_count())
        }
        if names != set(unit.instances):
            raise HarnessError(
                f"{path}: compiled kernels {sorted(names)} differ from the scanned "
                f"{sorted(unit.instances)}"
            )

    @property
    def kernels(self) -> list[str]:
        return sorted(self.unit.instances)

    def launch(self, desc: LaunchDesc) -> int:
        # One launch at a time in the process: the executor owns the signal
        # handlers and its state is global.
        with _lock:
            return self.lib.mh_run(ctypes.byref(desc))

    def source_location(self, pcs: list[int]) -> list[str]:
        """Source lines for fault addresses, kernel code first."""
        if not pcs or not shutil.which("addr2line"):
            return []
        res = subprocess.run(
            ["addr2line", "-e", str(self.so_path), "-f", "-i", "-C", "-a", *[hex(p) for p in pcs]],
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            return []
        # Output: an address line, then (function, file:line) pairs for the
        # inlined frames, innermost first.
        frames = []
        lines = [ln for ln in res.stdout.splitlines() if not ln.startswith("0x")]
        for loc in lines[1::2]:
            loc = loc.split(" (discriminator")[0]
            path = loc.rsplit(":", 1)[0]
            if path.startswith("??") or path.startswith(str(INCLUDE)) or path == str(RUNTIME):
                continue
            if path.startswith("/usr/") or loc in frames:
                continue
            frames.append(loc)
        return frames


def load(path: str | os.PathLike, include_dirs=(), version: int | None = None) -> Program:
    """Scan, rewrite, compile (or reuse) and load a .metal file (with the
    header folders and language version scan() takes)."""
    p = Path(path)
    if not p.is_absolute():
        p = (ROOT / p) if (ROOT / p).exists() else p.resolve()
    p = p.resolve()
    include_dirs = tuple(str(Path(d).resolve()) for d in include_dirs)
    version = metal_version(p) if version is None else int(version)
    loaded = (p, include_dirs, version)
    with _lock:
        if loaded in _programs:
            return _programs[loaded]
        text = scan(p, include_dirs, version)
        # Apple's compiler first: what it rejects never reaches the executor.
        try:
            strict.check(p, text, version, cache_dir())
        except strict.StrictError as e:
            raise HarnessError(str(e)) from e
        try:
            unit = src.process(text)
        except src.SourceError as e:
            raise HarnessError(f"{p}: {e}") from e
        rt = runtime_object()
        key = hashlib.sha256((unit.text + _shim_digest()).encode()).hexdigest()[:20]
        so = cache_dir() / f"{p.stem}-{key}.so"
        if not so.exists():
            fd, tmp_cpp = tempfile.mkstemp(suffix=".cpp", dir=so.parent)
            with os.fdopen(fd, "w") as f:
                f.write(unit.text)
            tmp_so = tmp_cpp[:-4] + ".so"
            try:
                _compile(
                    [CXX, *COMMON_FLAGS, *KERNEL_FLAGS, "-x", "c++", tmp_cpp, "-x", "none",
                     str(rt), "-shared", "-o", tmp_so, "-lm"],
                    str(p),
                )
                os.replace(tmp_so, so)
            finally:
                for t in (tmp_cpp, tmp_so):
                    if os.path.exists(t):
                        os.unlink(t)
        prog = Program(p, unit, so)
        _programs[loaded] = prog
        return prog
