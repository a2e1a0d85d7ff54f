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
(``~/.cache/mlx_lattice/cuda``); files are written whole and renamed into
place, so concurrent processes and ranks share it safely.
``MLX_LATTICE_CUDA_CACHE=off`` compiles through MLX instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import mlx.core as mx

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


def cache_dir() -> Path | None:
    """Where compiled kernels are kept; None when switched off."""
    env = os.environ.get("MLX_LATTICE_CUDA_CACHE")
    if env == "off":
        return None
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mlx_lattice" / "cuda"


class _Nvrtc:
    """The NVRTC library MLX already loaded, the GPU's architecture and the
    include paths MLX compiles with."""

    def __init__(self):
        self.lib = self._load()
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = f"{major.value}.{minor.value}"
        self.arch = self._arch()
        self.includes = self._includes()

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
            opts = [f"--gpu-architecture={self.arch}"] + [f"--include-path={p}" for p in self.includes]
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


_lock = threading.Lock()
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


class Kernel:
    """``mx.fast.cuda_kernel``'s callable, with compiled code kept on disk."""

    def __init__(self, name, input_names, output_names, source, header="", shared_memory=0):
        self.name, self.source, self.header = name, source, header
        self.input_names, self.output_names = list(input_names), list(output_names)
        self.shared_memory = shared_memory
        # Inputs whose shapes the source reads (``x_shape[i]``): their sizes
        # become int scalars (MLX would pass a Shape struct).
        self.shaped = [n for n in self.input_names if f"{n}_shape" in source]
        self._uses_other_info = any(f"{n}_strides" in source or f"{n}_ndim" in source for n in self.input_names)
        self._mlx = None
        self._built: dict[tuple, tuple[str, bytes]] = {}

    def _mlx_kernel(self):
        if self._mlx is None:
            self._mlx = mx.fast.cuda_kernel(
                name=self.name, input_names=self.input_names, output_names=self.output_names,
                source=self.source, header=self.header, shared_memory=self.shared_memory)
        return self._mlx

    def _specialised(self, inputs, output_dtypes, template) -> str:
        params = []
        for n, a in zip(self.input_names, inputs):
            params.append(f"    const {_CUDA_TYPES[a.dtype]}* {n}")
        for n, dt in zip(self.output_names, output_dtypes):
            params.append(f"    {_CUDA_TYPES[dt]}* {n}")
        shape_lines = []
        for n, a in zip(self.input_names, inputs):
            if n in self.shaped:
                params += [f"    int {n}_shape_{i}" for i in range(a.ndim)]
                dims = ", ".join(f"{n}_shape_{i}" for i in range(a.ndim))
                shape_lines.append(f"  const int {n}_shape[{max(a.ndim, 1)}] = {{{dims}}};")
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

    def _build(self, key, inputs, output_dtypes, template) -> tuple[str, bytes] | None:
        comp = _nvrtc()
        directory = cache_dir()
        if comp is None or directory is None:
            return None
        text = self._specialised(inputs, output_dtypes, template)
        digest = hashlib.sha256(f"{comp.arch}\n{comp.version}\n{text}".encode()).hexdigest()[:24]
        name = f"{self.name}_{digest}"
        text = text.replace("KERNEL_NAME", name)
        path = directory / comp.arch / f"{name}.cubin"
        try:
            return name, path.read_bytes()
        except OSError:
            pass
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
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(cubin)
            os.replace(tmp, path)
        except OSError as e:
            warnings.warn(f"mlx_lattice: could not keep a compiled CUDA kernel in {directory}: {e}", stacklevel=4)
        return name, cubin

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, template=(),
                 init_value=None, stream=None, **kw):
        template = list(template)
        if self._uses_other_info or kw:
            return self._mlx_kernel()(inputs=inputs, output_shapes=output_shapes, output_dtypes=output_dtypes,
                                      grid=grid, threadgroup=threadgroup, template=template,
                                      init_value=init_value, stream=stream, **kw)
        key = (tuple((a.dtype, a.ndim) for a in inputs), tuple(output_dtypes),
               tuple((k, v) for k, v in template))
        built = self._built.get(key)
        if built is None:
            built = self._build(key, inputs, output_dtypes, template) or ("", b"")
            self._built[key] = built
            BUILT.append((self, key))
        name, cubin = built
        if not cubin:
            return self._mlx_kernel()(inputs=inputs, output_shapes=output_shapes, output_dtypes=output_dtypes,
                                      grid=grid, threadgroup=threadgroup, template=template,
                                      init_value=init_value, stream=stream)
        scalars = [int(d) for n, a in zip(self.input_names, inputs) if n in self.shaped for d in a.shape]
        return mx.fast.precompiled_cuda_kernel(
            name=name, compiled_source=cubin, inputs=inputs, output_shapes=output_shapes,
            output_dtypes=output_dtypes, scalars=scalars, grid=grid, threadgroup=threadgroup,
            shared_memory=self.shared_memory, init_value=init_value, ensure_row_contiguous=True,
            stream=stream)


def kernel(name, input_names, output_names, source, header="", shared_memory=0) -> Kernel:
    """``mx.fast.cuda_kernel`` with its compiled code kept on disk."""
    return Kernel(name, input_names, output_names, source, header, shared_memory)


def params(*vals) -> mx.array:
    """Scalar kernel parameters as one int32 array."""
    return mx.array(np.array(vals, dtype=np.int32))


def launch(kern: Kernel, n: int, inputs, shapes, dtypes, template=(), init_value=None, stream=None):
    """``kern`` with one thread per element of ``n`` (blocks of 256);
    ``stream``: where it runs (the map builders pin the GPU, so that a set
    hashed there keeps building its maps there under ``mx.stream(mx.cpu)``)."""
    return kern(
        inputs=inputs, template=list(template), grid=(max(n, 1), 1, 1), threadgroup=(256, 1, 1),
        output_shapes=shapes, output_dtypes=dtypes, init_value=init_value, stream=stream,
    )
