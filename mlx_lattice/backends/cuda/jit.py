"""CUDA kernels compiled once per GPU architecture and kept on disk.

``mx.fast.cuda_kernel`` compiles each specialisation (dtypes and template
constants) with NVRTC in every new process, and a MinkUNet training step
needs a few dozen of them: its first step took minutes in every process.
:func:`kernel` takes the same arguments and returns a callable with the same
signature, but compiles the specialised source itself (NVRTC through ctypes,
with the options, headers and function signature MLX would use), stores the
cubin under the user cache directory keyed by the source, the GPU
architecture and the NVRTC release, and launches it with
``mx.fast.precompiled_cuda_kernel``. A later process loads the cubin from
disk. Where NVRTC or the headers cannot be found, it says so once and uses
``mx.fast.cuda_kernel`` (the same kernel, compiled per process).

Cache: ``$MLX_LATTICE_CUDA_CACHE``, else ``$XDG_CACHE_HOME/mlx_lattice/cuda``
(``~/.cache/mlx_lattice/cuda``; see :func:`cache_dir`), one directory per
GPU architecture. ``MLX_LATTICE_CUDA_CACHE=off`` compiles through MLX
instead. Cubins are written whole (flushed to disk, renamed into place), so
concurrent processes and ranks share the directory safely; each directory's
``manifest.jsonl`` gets one line per kernel compiled, appended in one write
under a lock. A cubin that is not whole (:func:`cubin_problem`: cut short,
not an ELF file for CUDA) is never launched: it is compiled again and
replaced, with a warning naming the file. Lines of the list this package
cannot use are skipped with a warning naming the file and the lines;
``python -m mlx_lattice cuda-prebuild`` rewrites the list without them.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import struct
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import mlx.core as mx

from ... import _files

# What a kernel body may use: the half and bfloat16 types and fixed-width
# integers (sources add their own headers, such as <mma.h>). MLX's own
# prologue also includes <cooperative_groups.h> and libcu++: no kernel here
# uses them, and they made each compile about 1.2 s longer (0.25 s against
# 1.4 s for a tensor-core kernel) and each cubin 150 KB larger, bytes that
# every launch hands to MLX.
_PROLOGUE = """#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long int64_t;
typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;
typedef unsigned long uint64_t;

"""

_CUDA_TYPES = {
    mx.float32: "float", mx.float16: "__half", mx.bfloat16: "__nv_bfloat16", mx.bool_: "bool",
    mx.int8: "int8_t", mx.int16: "int16_t", mx.int32: "int32_t", mx.int64: "int64_t",
    mx.uint8: "uint8_t", mx.uint16: "uint16_t", mx.uint32: "uint32_t", mx.uint64: "uint64_t",
}


ENV_CACHE = "MLX_LATTICE_CUDA_CACHE"
ENV_WORKERS = "MLX_LATTICE_CUDA_COMPILE_WORKERS"


def cache_dir() -> Path | None:
    """Where compiled kernels are kept; None when switched off
    (``MLX_LATTICE_CUDA_CACHE=off``, any case). A set variable names the
    directory (``~`` expanded, a relative path taken from the working
    directory); an empty one counts as unset: ``$XDG_CACHE_HOME`` where it
    is an absolute path (a relative one is ignored, as the XDG rules say),
    else ``~/.cache``, then ``mlx_lattice/cuda``."""
    env = os.environ.get(ENV_CACHE, "").strip()
    if env.lower() == "off":
        return None
    if env:
        return Path(os.path.abspath(os.path.expanduser(env)))
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mlx_lattice" / "cuda"


# A cubin is an ELF file for the CUDA machine (e_machine 190).
_ELF_CUDA = 190


def cubin_problem(data: bytes) -> str | None:
    """Why ``data`` is not a whole cubin, or None: an ELF file for CUDA whose
    header, program headers and section headers (and every section's
    bytes) lie within it. A file cut short, or not a cubin at all, fails;
    a torn write cannot pass (the tables sit at the end of the file)."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        return f"not an ELF file ({len(data)} bytes)"
    if data[4] != 2 or data[5] != 1:
        return "not a 64-bit little-endian ELF file"
    (machine,) = struct.unpack_from("<H", data, 18)
    if machine != _ELF_CUDA:
        return f"an ELF file for machine {machine}, not CUDA ({_ELF_CUDA})"
    phoff, shoff = struct.unpack_from("<QQ", data, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 54)
    size = len(data)
    if shnum and shentsize < 64:
        return f"section headers of {shentsize} bytes, not 64"
    if phoff + phnum * phentsize > size or shoff + shnum * shentsize > size:
        return f"cut short: its header tables end past its {size} bytes"
    for i in range(shnum):
        sh_type, = struct.unpack_from("<I", data, shoff + i * shentsize + 4)
        offset, length = struct.unpack_from("<QQ", data, shoff + i * shentsize + 24)
        if sh_type != 8 and offset + length > size:  # 8: SHT_NOBITS, no bytes in the file
            return f"cut short: section {i} ends at byte {offset + length} of {size}"
    return None


_said: set = set()


def _warn_once(what: str, stacklevel: int = 3) -> None:
    with _lock:
        if what in _said:
            return
        _said.add(what)
    warnings.warn(f"mlx_lattice: {what}", RuntimeWarning, stacklevel=stacklevel)


def _manifest_lock(directory: Path):
    """An exclusive lock on a cache directory's list: appends and the
    rewrite of cuda-prebuild do not lose each other's lines."""
    return _files.locked(directory / "manifest.jsonl.lock")


class _Nvrtc:
    """The NVRTC library MLX already loaded, the GPU's architecture and the
    include paths MLX compiles with."""

    def __init__(self, arch: str | None = None):
        self.lib = self._load()
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = f"{major.value}.{minor.value}"
        # arch: the GPU's (read from the driver) unless named (a build
        # ahead of time on a machine that sees no GPU).
        self.arch = arch or self._arch()
        self.includes = self._includes()
        self.options = [f"--gpu-architecture={self.arch}"] + [f"--include-path={p}" for p in self.includes]
        self.path = self._path()

    @staticmethod
    def _path() -> str | None:
        """The file of the NVRTC library this process loaded (for the
        compiler processes, which cannot rely on libmlx's search path)."""
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    if "libnvrtc.so" in line and "/" in line:
                        return line[line.index("/"):].strip()
        except OSError:
            pass
        return None

    @staticmethod
    def _load():
        names = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
        for name in names:  # the soname libmlx linked against, already in the process
            try:
                return ctypes.CDLL(name)
            except OSError:
                pass
        for root in _site_dirs():
            for lib in sorted((root / "nvidia").glob("*/lib/libnvrtc.so*"), reverse=True):
                try:
                    return ctypes.CDLL(str(lib))
                except OSError:
                    pass
        raise OSError("libnvrtc not found")

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what} failed: {self.lib.nvrtcGetErrorString(code).decode()}")

    @staticmethod
    def _arch() -> str:
        cuda = ctypes.CDLL("libcuda.so.1")
        dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        if cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(dev), 0):
            raise OSError("no CUDA device")
        cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # compute capability major
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # and minor
        return f"sm_{major.value}{minor.value}"

    @staticmethod
    def _includes() -> list[str]:
        mlx_dir = Path(next(iter(sys.modules["mlx"].__path__)))
        paths = [mlx_dir / "include", mlx_dir / "include" / "cccl"]
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        paths.append(Path(home) / "include")
        for root in _site_dirs():
            paths += sorted((root / "nvidia").glob("*/include"))
        found = [str(p) for p in paths if p.is_dir()]
        if not any((Path(p) / "cuda_fp16.h").exists() for p in found):
            raise OSError("the CUDA headers (cuda_fp16.h) are not found: set CUDA_HOME")
        return found

    def compile(self, source: str, name: str) -> bytes:
        lib = self.lib
        prog = ctypes.c_void_p()
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(),
                                           0, None, None), "nvrtcCreateProgram")
        try:
            opts = self.options
            arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            code = lib.nvrtcCompileProgram(prog, len(opts), arr)
            if code != 0:
                size = ctypes.c_size_t()
                lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                log = ctypes.create_string_buffer(size.value + 1)
                lib.nvrtcGetProgramLog(prog, log)
                raise RuntimeError(f"NVRTC could not compile {name}: {log.value.decode(errors='replace')}")
            size = ctypes.c_size_t()
            self._check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            out = ctypes.create_string_buffer(size.value)
            self._check(lib.nvrtcGetCUBIN(prog, out), "nvrtcGetCUBIN")
            return out.raw
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _site_dirs() -> list[Path]:
    import site

    dirs = [Path(p) for p in sys.path if p.endswith("site-packages")]
    try:
        dirs += [Path(p) for p in site.getsitepackages()]
    except AttributeError:
        pass
    return list(dict.fromkeys(dirs))


_lock = threading.RLock()
# Every (kernel, specialisation) this process has asked for, in order.
BUILT: list[tuple["Kernel", tuple]] = []
_compiler: _Nvrtc | None = None
_compiler_error: str | None = None


def _nvrtc() -> _Nvrtc | None:
    """The compiler, or None (said once) where it cannot be had."""
    global _compiler, _compiler_error
    with _lock:
        if _compiler is None and _compiler_error is None:
            try:
                _compiler = _Nvrtc()
            except (OSError, RuntimeError, AttributeError) as e:
                _compiler_error = str(e)
                warnings.warn(f"mlx_lattice: CUDA kernels compile through MLX in every process ({e}); "
                              "no kernel cache on disk", stacklevel=3)
        return _compiler


# --------------------------------------------------------- kernel manifests
# A specialisation as one JSON line: the kernel's name, its inputs' dtypes
# and ranks, its output dtypes and template (dtypes by name). Each cache
# directory keeps those its processes compiled (manifest.jsonl beside the
# cubins); the package lists those its training steps use (manifest.jsonl
# beside this file), so that a new machine compiles them side by side.
_KERNELS: dict[str, "Kernel"] = {}
_SHIPPED = Path(__file__).with_name("manifest.jsonl")
_NAMED_DTYPES = {n: getattr(mx, n) for n in (
    "float32", "float16", "bfloat16", "bool_", "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64")}
_DTYPE_NAMES = {v: k for k, v in _NAMED_DTYPES.items()}
# A ``params`` input given as :class:`Params`: its values are passed by
# value (int scalars), its key entry is (SCALARS, how many).
SCALARS = "scalars"
_NAMED_DTYPES[SCALARS] = SCALARS


def _entry(kernel: "Kernel", key: tuple) -> str:
    ins, outs, template = key
    name = lambda v: _DTYPE_NAMES[v] if isinstance(v, mx.Dtype) else v  # noqa: E731
    return json.dumps({"kernel": kernel.name, "inputs": [[name(d), n] for d, n in ins],
                       "outputs": [name(d) for d in outs], "template": [[k, name(v)] for k, v in template]})


def _dtype(key: tuple):
    """The feature dtype a specialisation is made for (its template's T), or
    None for kernels that serve every dtype (index and statistics kernels)."""
    return next((v for k, v in key[2] if k == "T"), None)


class _Standin:
    """What a specialisation reads of an input: its dtype and rank."""

    def __init__(self, dtype, ndim):
        self.dtype, self.ndim = dtype, ndim


# Finds the kernel a manifest line names, made by the module that owns it
# (set by the package: kernel_index.find; this module imports none of the
# modules whose kernels it builds).
_kernel_finder = None


def set_kernel_finder(find) -> None:
    """Say how a kernel named in a manifest is found: ``find(name)`` returns
    it (made by its module) or None."""
    global _kernel_finder
    _kernel_finder = find


def _find_kernel(name: str) -> "Kernel | None":
    """The kernel named ``name``, made by the module that owns it."""
    if name not in _KERNELS and _kernel_finder is not None:
        _kernel_finder(name)
    return _KERNELS.get(name)


def _parse(line: str):
    """(kernel, key) of a manifest line, or None where it names nothing this
    package has (an older or newer package's line)."""
    got = _read_line(line)
    return None if isinstance(got, str) else got


def _read_line(line: str):
    """(kernel, key) of a manifest line, or why it cannot be used."""
    try:
        e = json.loads(line)
    except ValueError:
        return "not JSON"
    try:
        kernel = _find_kernel(e["kernel"])
        if kernel is None:
            return f"no kernel {e['kernel']!r} in this package"
        key = (tuple((_NAMED_DTYPES[d], int(n)) for d, n in e["inputs"]),
               tuple(_NAMED_DTYPES[d] for d in e["outputs"]),
               tuple((str(k), _NAMED_DTYPES[v] if isinstance(v, str) else v) for k, v in e["template"]))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        return f"not a kernel specialisation ({err.__class__.__name__}: {err})"
    if len(key[0]) != len(kernel.input_names) or len(key[1]) != len(kernel.output_names):
        return f"{kernel.name} takes {len(kernel.input_names)} inputs and {len(kernel.output_names)} outputs"
    if not all(isinstance(v, (bool, int, mx.Dtype)) for _, v in key[2]):
        return "a template value is not a dtype, an integer or a flag"
    return kernel, key


def _read_manifest(path) -> tuple[list, dict] | None:
    """((kernel, key) of each usable line, {line number: why} of the
    others) of one list, or None where there is no file."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        _warn_once(f"the CUDA kernel list {path} is unreadable ({e}); not used")
        return None
    good, bad = [], {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        got = _read_line(line)
        if isinstance(got, str):
            bad[n] = got
        else:
            good.append(got)
    return good, bad


def _say_bad_lines(path, bad: dict) -> None:
    if bad:
        shown = "; ".join(f"line {n}: {why}" for n, why in list(bad.items())[:3])
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        _warn_once(f"the CUDA kernel list {path}: {len(bad)} lines cannot be used ({shown}{more}); "
                   "skipped (python -m mlx_lattice cuda-prebuild rewrites the list without them)", stacklevel=4)


def manifest(paths=None) -> list:
    """(kernel, key) of every specialisation listed in ``paths`` (default:
    the package's list and this machine's cache's), each once. Lines this
    package cannot use (another release's kernels, a damaged line) are
    skipped with a warning naming the file and the lines."""
    if paths is None:
        comp, directory = _nvrtc(), cache_dir()
        paths = [_SHIPPED] + ([directory / comp.arch / "manifest.jsonl"] if comp and directory else [])
    seen, out = set(), []
    for p in paths:
        got = _read_manifest(p)
        if got is None:
            continue
        good, bad = got
        _say_bad_lines(p, bad)
        for kernel, key in good:
            if (kernel.name, key) not in seen:
                seen.add((kernel.name, key))
                out.append((kernel, key))
    return out


def tidy_manifest(directory: Path) -> int:
    """Rewrite a cache directory's list without the lines this package
    cannot use and without repeats; returns how many lines went."""
    path = directory / "manifest.jsonl"
    with _manifest_lock(directory):
        try:
            lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        except FileNotFoundError:
            return 0
        kept, seen = [], set()
        for line in lines:
            got = _read_line(line)
            if isinstance(got, str) or (got[0].name, got[1]) in seen:
                continue
            seen.add((got[0].name, got[1]))
            kept.append(_entry(*got))
        if len(kept) != len(lines):
            _files.write_whole(path, "".join(k + "\n" for k in kept).encode())
        return len(lines) - len(kept)


# ----------------------------------------------------- the compiler processes
def compile_workers() -> int:
    """Compiler processes of a first miss: ``$MLX_LATTICE_CUDA_COMPILE_WORKERS``
    (a whole number >= 0; 0: none, every kernel compiles in the process that
    needs it), else one per core but one, at most 8. Any other value raises
    ValueError."""
    env = os.environ.get(ENV_WORKERS, "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            n = -1
        if n < 0:
            raise ValueError(f"{ENV_WORKERS}={env!r}: expected a whole number of compiler processes >= 0 "
                             "(0: compile in the process that needs the kernel)")
        return n
    return max(0, min(8, (os.cpu_count() or 1) - 1))


class _Pool:
    """Compiler processes (nvrtc_worker.py) fed from one queue; a cubin asked
    for while queued or compiling there is waited for."""

    def __init__(self, comp: _Nvrtc, directory: Path, workers: int, entries: list | None = None):
        import queue
        import subprocess

        self.comp, self.directory = comp, directory
        self.jobs: "queue.Queue" = queue.Queue()
        self.done: dict[str, threading.Event] = {}
        self.taken: set = set()  # paths a worker or the caller has started
        self.offered: set = set()
        self.entries = manifest() if entries is None else entries
        script = str(Path(__file__).with_name("nvrtc_worker.py"))
        self.procs = []
        for _ in range(workers):
            proc = subprocess.Popen([sys.executable, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True, bufsize=1)
            self.procs.append(proc)
            threading.Thread(target=self._feed, args=(proc,), daemon=True).start()

    def offer(self, dtype) -> None:
        """Queue the listed specialisations for this feature dtype (and those
        for every dtype) not compiled yet; each dtype once per process."""
        new = {None, dtype} - self.offered
        if not new:
            return
        self.offered |= new
        queued = sum(self._queue(kernel, key) for kernel, key in self.entries if _dtype(key) in new)
        if queued:
            print(f"mlx_lattice: compiling {queued} CUDA kernels for {self.comp.arch} in {len(self.procs)} "
                  f"processes (kept in {self.directory})", file=sys.stderr, flush=True)

    def _queue(self, kernel: "Kernel", key: tuple) -> bool:
        ins, outs, template = key
        name, text, path = kernel._target(self.comp, self.directory,
                                          [_Standin(d, n) for d, n in ins], list(outs), list(template))
        if str(path) in self.done or _cached_cubin(path) is not None:
            return False
        self.done[str(path)] = threading.Event()
        self.jobs.put({"lib": self.comp.path, "options": self.comp.options, "name": name,
                       "source": text, "path": str(path)})
        return True

    def _take(self, path: str) -> bool:
        with _lock:
            if path in self.taken:
                return False
            self.taken.add(path)
            return True

    def _feed(self, proc) -> None:
        while True:
            job = self.jobs.get()
            if not self._take(job["path"]):
                continue  # the caller compiles it
            try:
                proc.stdin.write(json.dumps(job) + "\n")
                proc.stdin.flush()
                proc.stdout.readline()  # the reply: the cubin is on disk, or the caller compiles it
            except (OSError, ValueError):
                pass
            finally:
                self.done[job["path"]].set()

    def wait(self, path: str, timeout: float = 300.0) -> bool:
        """Whether a worker has attempted ``path`` (waiting for it where one
        is compiling it); False where it is the caller's to compile (not
        queued, or still waiting in the queue: taken back from it)."""
        event = self.done.get(path)
        if event is None:
            return False
        if self._take(path):
            event.set()  # no worker will: a later wait reads what the caller left
            return False
        return event.wait(timeout)

    def close(self) -> None:
        """Let the compiler processes end once their queue is done."""
        for proc in self.procs:
            try:
                proc.stdin.close()
            except OSError:
                pass


def prebuild(dtypes=(mx.float16, mx.bfloat16, mx.float32), arch: str | None = None,
             workers: int | None = None, manifests=None) -> dict:
    """Compile ahead of time every listed specialisation (the package's
    list and the cache's, or ``manifests``) for ``dtypes`` into the cache,
    side by side; ``arch`` (``sm_90``, ...) where no GPU is visible, as in
    an image build. Returns {"compiled", "cached", "failed", "seconds",
    "arch", "directory"}."""
    directory = cache_dir()
    if directory is None:
        raise ValueError("MLX_LATTICE_CUDA_CACHE is off: there is no cache to build into")
    comp = _Nvrtc(arch)
    if comp.path is None:
        raise OSError("the NVRTC library file is not found in this process")
    # the cache's own list, without what this package cannot use
    tidied = tidy_manifest(directory / comp.arch)
    entries = manifest(manifests if manifests is not None
                       else [_SHIPPED, directory / comp.arch / "manifest.jsonl"])
    t = time.perf_counter()
    pool = _Pool(comp, directory, max(1, workers if workers is not None else compile_workers()), entries)
    try:
        listed = sum(1 for _, key in entries if _dtype(key) in set(dtypes) | {None})
        for dt in dtypes:
            pool.offer(dt)
        for event in list(pool.done.values()):
            event.wait()
    finally:
        pool.close()
    failed = sum(1 for p in pool.done if _cached_cubin(Path(p)) is None)
    return {"compiled": len(pool.done) - failed, "cached": listed - len(pool.done), "failed": failed,
            "seconds": time.perf_counter() - t, "arch": comp.arch, "directory": str(directory / comp.arch),
            "list_lines_dropped": tidied}


_the_pool: _Pool | None = None
_pool_failed = False


def _cached_cubin(path: Path) -> bytes | None:
    """The cubin kept at ``path``, or None: absent, unreadable, or not a
    whole cubin (said once per file; the next compile of it replaces it)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        _warn_once(f"the cached CUDA kernel {path} is unreadable ({e}); compiling it again", stacklevel=4)
        return None
    why = cubin_problem(data)
    if why is not None:
        _warn_once(f"the cached CUDA kernel {path} is {why}; compiling it again (it is replaced)",
                   stacklevel=4)
        return None
    return data


def _pool(comp: _Nvrtc, directory: Path) -> _Pool | None:
    global _the_pool, _pool_failed
    with _lock:
        if _the_pool is None and not _pool_failed:
            workers = compile_workers()
            if workers == 0 or comp.path is None:
                _pool_failed = True
            else:
                try:
                    _the_pool = _Pool(comp, directory, workers)
                except OSError:
                    _pool_failed = True
        return _the_pool


class Kernel:
    """``mx.fast.cuda_kernel``'s callable, with compiled code kept on disk."""

    def __init__(self, name, input_names, output_names, source, header="", shared_memory=0):
        self.name, self.source, self.header = name, source, header
        self.input_names, self.output_names = list(input_names), list(output_names)
        self.shared_memory = shared_memory
        # Inputs whose shapes the source reads (``x_shape[i]``): their sizes
        # become int scalars (MLX would pass a Shape struct).
        self.shaped = [n for n in self.input_names if f"{n}_shape" in source]
        self._shaped_at = tuple(i for i, n in enumerate(self.input_names) if n in self.shaped)
        self._params_at = self.input_names.index("params") if "params" in self.input_names else None
        self._uses_other_info = any(f"{n}_strides" in source or f"{n}_ndim" in source for n in self.input_names)
        self._mlx = None
        self._built: dict[tuple, tuple[str, bytes]] = {}  # by the call's specialisation
        _KERNELS.setdefault(name, self)

    def _mlx_kernel(self):
        if self._mlx is None:
            self._mlx = mx.fast.cuda_kernel(
                name=self.name, input_names=self.input_names, output_names=self.output_names,
                source=self.source, header=self.header, shared_memory=self.shared_memory)
        return self._mlx

    def _specialised(self, inputs, output_dtypes, template) -> str:
        params = []
        for n, a in zip(self.input_names, inputs):
            if a.dtype != SCALARS:
                params.append(f"    const {_CUDA_TYPES[a.dtype]}* {n}")
        for n, dt in zip(self.output_names, output_dtypes):
            params.append(f"    {_CUDA_TYPES[dt]}* {n}")
        shape_lines = []
        for n, a in zip(self.input_names, inputs):
            if n in self.shaped:
                params += [f"    int {n}_shape_{i}" for i in range(a.ndim)]
                dims = ", ".join(f"{n}_shape_{i}" for i in range(a.ndim))
                shape_lines.append(f"  const int {n}_shape[{max(a.ndim, 1)}] = {{{dims}}};")
        for n, a in zip(self.input_names, inputs):
            if a.dtype == SCALARS:  # read as before, from a local array of the values
                params += [f"    int {n}_{i}" for i in range(a.ndim)]
                vals = ", ".join(f"{n}_{i}" for i in range(a.ndim))
                shape_lines.append(f"  [[maybe_unused]] const int {n}[{max(a.ndim, 1)}] = {{{vals}}};")
        consts = []
        for key, value in template:
            if isinstance(value, bool):
                consts.append(f"  constexpr bool {key} = {'true' if value else 'false'};")
            elif isinstance(value, int):
                consts.append(f"  constexpr int {key} = {value};")
            else:
                consts.append(f"  using {key} = {_CUDA_TYPES[value]};")
        return (_PROLOGUE + self.header + "namespace mlx::core::cu {\n\n"
                "extern \"C\" __global__ void KERNEL_NAME(\n" + ",\n".join(params) + ") {\n"
                + "\n".join(shape_lines + consts) + "\n\n" + self.source + "\n}\n\n} // namespace mlx::core::cu\n")

    def _target(self, comp: _Nvrtc, directory: Path, inputs, output_dtypes, template):
        """(kernel name, source, cubin path) of a specialisation: named and
        kept by a digest of its source, the architecture and the NVRTC
        release."""
        text = self._specialised(inputs, output_dtypes, template)
        digest = hashlib.sha256(f"{comp.arch}\n{comp.version}\n{text}".encode()).hexdigest()[:24]
        name = f"{self.name}_{digest}"
        return name, text.replace("KERNEL_NAME", name), directory / comp.arch / f"{name}.cubin"

    def _build(self, key, inputs, output_dtypes, template) -> tuple[str, bytes] | None:
        comp = _nvrtc()
        directory = cache_dir()
        if comp is None or directory is None:
            return None
        name, text, path = self._target(comp, directory, inputs, output_dtypes, template)
        cubin = _cached_cubin(path)
        if cubin is not None:
            return name, cubin
        # A first miss: the kernels this machine's earlier processes used,
        # and those the package lists for this dtype, compile side by side
        # while the caller goes on; this one is waited for if queued there.
        pool = _pool(comp, directory)
        if pool is not None:
            pool.offer(_dtype(key))
            if pool.wait(str(path)):
                cubin = _cached_cubin(path)
                if cubin is not None:
                    return name, cubin
        t = time.perf_counter()
        desc = ", ".join(f"{k}={v}" for k, v in template)
        print(f"mlx_lattice: compiling CUDA kernel {self.name} ({desc}) for {comp.arch}...",
              end="", file=sys.stderr, flush=True)
        try:
            cubin = comp.compile(text, name)
        except RuntimeError as e:
            print(" failed", file=sys.stderr, flush=True)
            warnings.warn(f"mlx_lattice: {e}; this kernel compiles through MLX instead", stacklevel=4)
            return None
        print(f" {time.perf_counter() - t:.1f} s (kept in {directory})", file=sys.stderr, flush=True)
        try:
            _files.write_whole(path, cubin)
            with _manifest_lock(path.parent):
                _files.append_line(path.parent / "manifest.jsonl", _entry(self, key))
        except OSError as e:
            warnings.warn(f"mlx_lattice: could not keep a compiled CUDA kernel in {directory}: {e}",
                          RuntimeWarning, stacklevel=4)
        return name, cubin

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, template=(),
                 init_value=None, stream=None, **kw):
        # A training step makes hundreds of these calls: the common path
        # (a specialisation built before) builds its key with list
        # comprehensions, not generators, and nothing else.
        if self._uses_other_info or kw:
            return self._mlx_kernel()(inputs=_arrays(inputs), output_shapes=output_shapes,
                                      output_dtypes=output_dtypes, grid=grid, threadgroup=threadgroup,
                                      template=list(template), init_value=init_value, stream=stream, **kw)
        # What fixes the specialisation: the inputs' dtypes, the ranks of
        # those whose shapes the source reads, the outputs' dtypes and the
        # template (the manifest's key, with every input's rank, is made
        # on a miss only).
        fast = (tuple([a.dtype for a in inputs]), tuple([inputs[i].ndim for i in self._shaped_at]),
                tuple(output_dtypes), tuple(template))
        built = self._built.get(fast)
        if built is None:
            template = [(k, v) for k, v in template]
            key = (tuple([(a.dtype, a.ndim) for a in inputs]), tuple(output_dtypes), tuple(template))
            built = self._build(key, inputs, output_dtypes, template) or ("", b"")
            self._built[fast] = built
            BUILT.append((self, key))
        name, cubin = built
        if not cubin:
            return self._mlx_kernel()(inputs=_arrays(inputs), output_shapes=output_shapes,
                                      output_dtypes=output_dtypes, grid=grid, threadgroup=threadgroup,
                                      template=list(template), init_value=init_value, stream=stream)
        scalars = [d for i in self._shaped_at for d in inputs[i].shape]
        at = self._params_at
        if at is not None and type(inputs[at]) is Params:
            scalars += inputs[at]
            scalars += _ZEROS[len(inputs[at]):]
            inputs = inputs[:at] + inputs[at + 1:]
        return mx.fast.precompiled_cuda_kernel(
            name=name, compiled_source=cubin, inputs=inputs, output_shapes=output_shapes,
            output_dtypes=output_dtypes, scalars=scalars, grid=grid, threadgroup=threadgroup,
            shared_memory=self.shared_memory, init_value=init_value, ensure_row_contiguous=True,
            stream=stream)


def kernel(name, input_names, output_names, source, header="", shared_memory=0) -> Kernel:
    """``mx.fast.cuda_kernel`` with its compiled code kept on disk."""
    return Kernel(name, input_names, output_names, source, header, shared_memory)


class Family:
    """The kernels one module makes: ``family(name)`` is the kernel
    ``prefix + name`` built from ``specs[name]`` (input names, output names,
    source) with ``header``, made once per process (KeyError: no such
    kernel); ``family.launch`` runs one (:func:`launch`) on ``stream``
    (None: the default)."""

    def __init__(self, prefix: str, specs: dict, header: str = "", stream=None):
        self.prefix, self.specs, self.header, self.stream = prefix, specs, header, stream
        self._made = functools.lru_cache(maxsize=None)(self._make)

    def _make(self, name: str, shared_memory: int) -> Kernel:
        inputs, outputs, source = self.specs[name]
        return kernel(name=self.prefix + name, input_names=inputs, output_names=outputs, source=source,
                      header=self.header, shared_memory=shared_memory)

    def __call__(self, name: str, shared_memory: int = 0) -> Kernel:
        return self._made(name, shared_memory)

    def launch(self, name, n, inputs, shapes, dtypes, template=(), init_value=None):
        return launch(self(name), n, inputs, shapes, dtypes, template, init_value, stream=self.stream)


class Params(tuple):
    """Scalar kernel parameters, for a kernel's ``params`` input. A
    precompiled kernel gets them by value (int scalars its source reads as
    ``params[i]``), so a launch uploads nothing: a new sample's sizes would
    otherwise make a small array for the GPU to fetch at every launch. A
    kernel MLX compiles gets them as an int32 array (:func:`constant`)."""

    __slots__ = ()
    dtype = SCALARS
    # every kernel takes the same number (zeros after the values given), so
    # that a specialisation does not depend on how many a call site passes
    ndim = 16

    def array(self) -> mx.array:
        return constant(*self)


def params(*vals) -> Params:
    """Scalar kernel parameters, at most 16 (see :class:`Params`)."""
    if len(vals) > Params.ndim:
        raise ValueError(f"a kernel takes at most {Params.ndim} scalar parameters, got {len(vals)}")
    return Params(int(v) for v in vals)


_ZEROS = (0,) * Params.ndim


def _arrays(inputs) -> list:
    """The inputs as MLX's compiled kernels take them (Params as arrays)."""
    return [a.array() if type(a) is Params else a for a in inputs]


def constant(*vals) -> mx.array:
    """Small int32 values as an array input (a placeholder, or offsets that
    never change), made once per distinct values: a leaf that later launches
    reuse where it already lies."""
    return _constant(tuple(int(v) for v in vals))


@functools.lru_cache(maxsize=4096)
def _constant(vals: tuple) -> mx.array:
    return mx.array(np.array(vals, dtype=np.int32))


def launch(kern: Kernel, n: int, inputs, shapes, dtypes, template=(), init_value=None, stream=None):
    """``kern`` with one thread per element of ``n`` (blocks of 256);
    ``stream``: where it runs (the map builders pin the GPU, so that a set
    hashed there keeps building its maps there under ``mx.stream(mx.cpu)``)."""
    return kern(
        inputs=inputs, template=list(template), grid=(max(n, 1), 1, 1), threadgroup=(256, 1, 1),
        output_shapes=shapes, output_dtypes=dtypes, init_value=init_value, stream=stream,
    )
