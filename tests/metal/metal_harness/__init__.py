"""Run the project's Metal kernels on the CPU with GPU semantics.

``run_kernel`` compiles a .metal file as C++ against an MSL shim (cached) and
executes one kernel the way ``dispatch_threadgroups`` would: one threadgroup
at a time, each GPU thread a fiber that switches only at barriers and
simd-group collectives, buffers bounds-checked by guard pages, threadgroup
memory poisoned with NaN bytes at the start of each group.

A route's whole Metal program (``mlx_lattice._ext.metal_program``, the steps
``eval_gpu`` encodes) runs through ``tests/metal_programs.py``, which calls
``run_kernel`` once per step.

Kernels that ran are recorded for the coverage report (see plugin.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import platform
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import build
from .build import (
    MAX_THREADS_PER_THREADGROUP,
    ROOT,
    SCHEDULES,
    THREADGROUP_MEMORY_LIMIT,
    BufferDesc,
    HarnessError,
    LaunchDesc,
    load,
    parse,
)

__all__ = [
    "HarnessError",
    "KernelError",
    "SCHEDULES",
    "available",
    "defined_kernels",
    "kernels_ran",
    "load",
    "record_ran",
    "run_kernel",
]

METAL_DIR = ROOT / "metal"

_ran: dict[str, set[str]] = {}  # host name -> backends it ran on
_defined_cache: dict[Path, dict[str, Path]] = {}


class KernelError(AssertionError):
    """A kernel did something invalid on the (emulated) GPU."""


def available() -> tuple[bool, str]:
    """Whether the harness can run here, and if not, why."""
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return False, "the Metal CPU harness needs Linux on x86_64 (ucontext fibers, guard pages)"
    if shutil.which(build.CXX) is None:
        return False, f"no C++ compiler ({build.CXX}) for the Metal CPU harness"
    return True, ""


def record_ran(kernel: str, backend: str = "harness") -> None:
    _ran.setdefault(kernel, set()).add(backend)


def kernels_ran() -> dict[str, set[str]]:
    return {k: set(v) for k, v in _ran.items()}


def defined_kernels(metal_dir: str | Path | None = None) -> dict[str, Path]:
    """Host names of every kernel in metal/*.metal, mapped to their file."""
    d = Path(metal_dir) if metal_dir else METAL_DIR
    d = d.resolve()
    if d not in _defined_cache:
        out: dict[str, Path] = {}
        for f in sorted(d.glob("*.metal")):
            for name in parse(f).instances:
                out[name] = f
        _defined_cache[d] = out
    return dict(_defined_cache[d])


def _source_for(kernel: str) -> Path:
    found = defined_kernels().get(kernel)
    if found is None:
        raise HarnessError(f"no kernel named {kernel!r} in {METAL_DIR}/*.metal")
    return found


def _dims(v) -> tuple[int, int, int]:
    if isinstance(v, (int, np.integer)):
        v = (int(v),)
    v = tuple(int(x) for x in v)
    if not 1 <= len(v) <= 3:
        raise ValueError(f"expected 1 to 3 dimensions, got {v}")
    return v + (1,) * (3 - len(v))


def _params_array(params) -> np.ndarray:
    if isinstance(params, (bytes, bytearray)):
        return np.frombuffer(bytes(params), dtype=np.uint8).copy()
    if isinstance(params, np.void):
        return np.frombuffer(params.tobytes(), dtype=np.uint8).copy()
    if isinstance(params, np.ndarray):
        return np.ascontiguousarray(params).copy()
    if isinstance(params, Sequence):
        if not all(isinstance(v, (int, np.integer)) for v in params):
            raise TypeError("a params sequence packs int32 fields only; use a NumPy record for other types")
        return np.asarray(params, dtype=np.int32)
    raise TypeError(f"params must be bytes, a NumPy array/record or a sequence of ints, not {type(params)}")


@dataclass(frozen=True)
class Dispatch:
    """What one dispatch used: its kernel, threadgroups, threads per
    threadgroup, the most threadgroup memory a group used, and the
    multiply-adds its threads did through simdgroup_multiply_accumulate."""

    kernel: str
    threadgroups: int
    threads: int
    threadgroup_bytes: int
    matrix_macs: int


_dispatch_logs: list[list[Dispatch]] = []


def prod_dims(d) -> int:
    return int(d[0]) * int(d[1]) * int(d[2])


@contextlib.contextmanager
def dispatches():
    """Collect a Dispatch record for every kernel run in the block."""
    log: list[Dispatch] = []
    _dispatch_logs.append(log)
    try:
        yield log
    finally:
        _dispatch_logs.remove(log)


def run_kernel(
    source: str | Path,
    kernel: str,
    buffers: Sequence | Mapping,
    params=None,
    groups=(1, 1, 1),
    threads=(1, 1, 1),
    *,
    grid=None,
    params_index: int | None = None,
    threadgroup_buffers: Sequence[int] = (),
    schedule: str = "forward",
    seed: int = 0,
    strict: bool = True,
    timeout: float = 60.0,
    names: Sequence[str] | None = None,
    include_dirs: Sequence[str | Path] = (),
    version: int | None = None,
    function_constants: Mapping | None = None,
):
    """Run `kernel` from the .metal file `source` and return its buffers.

    buffers: a list (position = buffer index; None leaves an index unbound) or
      a dict {index: array}. Arrays are copied; the same object at several
      indices is one aliased buffer, as when a host binds one MTLBuffer twice.
    params: bound at `params_index` (default: after the last buffer) as
      bytes, a NumPy record/array, or a sequence of ints (packed as int32).
    groups, threads: dispatch_threadgroups(groups, threads). With `grid`,
      dispatch_threads(grid, threads): edge threadgroups are partial.
    threadgroup_buffers: byte lengths of [[threadgroup(n)]] buffers.
    schedule: 'forward', 'reverse' or 'random' (seeded) order of threads
      between barriers; groups run in the same order.
    strict: lanes that returned may not skip a simd-group collective that
      the rest of their simdgroup reaches (threads that returned are always
      released from threadgroup barriers, as Apple GPUs release them).
    include_dirs, version: header folders for the source's own includes and
      its language version (__METAL_VERSION__, e.g. 400), where the source
      is not one the project's build compiles.
    function_constants: {index or name: value} of the source's
      [[function_constant(n)]] declarations, as a pipeline sets them; one
      the kernel reads and the dispatch does not give fails the launch, and
      a parameter [[function_constant(c)]] exists only where c is true.

    Returns arrays of the same shape as given: a list for a list, a dict for
    a dict (the params buffer excluded).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}")
    prog = load(source, include_dirs, version)
    if kernel not in prog.unit.instances:
        raise HarnessError(f"{prog.path.name} defines no kernel {kernel!r}; it has {prog.kernels}")

    as_dict = isinstance(buffers, Mapping)
    items = dict(buffers) if as_dict else dict(enumerate(buffers))
    items = {int(k): v for k, v in items.items() if v is not None}
    if params is not None:
        pidx = params_index if params_index is not None else (max(items) + 1 if items else 0)
        if pidx in items:
            raise ValueError(f"params index {pidx} is already bound")
        items[pidx] = _params_array(params)
    n = max(items) + 1 if items else 0

    first_of: dict[int, int] = {}
    arrays: dict[int, np.ndarray] = {}
    descs = (BufferDesc * max(n, 1))()
    name_bytes = []
    for i in range(n):
        descs[i].bound = 0
        descs[i].alias = -1
        if i not in items:
            continue
        obj = items[i]
        label = (names[i] if names and i < len(names) else "") or ""
        name_bytes.append(label.encode())
        descs[i].name = name_bytes[-1]
        descs[i].bound = 1
        if id(obj) in first_of:
            j = first_of[id(obj)]
            descs[i].alias = j
            descs[i].nbytes = arrays[j].nbytes
            arrays[i] = arrays[j]
            continue
        first_of[id(obj)] = i
        arr = np.array(obj, copy=True, order="C")
        arrays[i] = arr
        descs[i].nbytes = arr.nbytes
        descs[i].host = arr.ctypes.data if arr.nbytes else None

    tg = (ctypes.c_uint64 * max(len(threadgroup_buffers), 1))()
    for i, size in enumerate(threadgroup_buffers):
        tg[i] = int(size)

    L = LaunchDesc()
    L.kernel = kernel.encode()
    L.buffers = descs
    L.tg_sizes = tg
    L.n_buffers = n
    L.n_tg_buffers = len(threadgroup_buffers)
    t = _dims(threads)
    if grid is not None:
        g = _dims(grid)
        L.grid[:] = g
        L.use_grid = 1
        groups = tuple(-(-a // b) for a, b in zip(g, t))
    L.groups[:] = _dims(groups)
    L.threads[:] = t
    L.schedule = SCHEDULES[schedule]
    L.strict = int(strict)
    L.seed = seed
    L.timeout_s = timeout
    L.tg_limit = THREADGROUP_MEMORY_LIMIT
    L.max_threads = MAX_THREADS_PER_THREADGROUP

    fc_index, fc_data = _function_constants(prog, function_constants or {})
    L.n_constants = len(fc_index)
    L.constant_index = fc_index
    L.constant_data = fc_data

    status = prog.launch(L)
    record_ran(kernel)
    if status == 0:
        for log in _dispatch_logs:
            log.append(Dispatch(kernel, prod_dims(_dims(groups)), prod_dims(t), int(L.tg_bytes),
                                int(L.matrix_macs)))
    if status != 0:
        msg = L.error.decode(errors="replace")
        where = prog.source_location(list(L.pcs[: L.n_pcs])) if status == 2 else []
        if not where:
            where = re.findall(r"at (\S+:\d+):\d+", msg)[:1]
        text = f"kernel {kernel} ({prog.path.name}): {msg}"
        if where:
            text += "\n  at " + "\n  called from ".join(_relative(w) for w in where[:4])
        raise KernelError(text)

    out = {i: arrays[i] for i in items if params is None or i != pidx}
    if as_dict:
        return {k: out[k] for k in sorted(out)}
    return [out.get(i) for i in range(len(buffers))]


_CONSTANT_DTYPES = {
    "bool": np.bool_, "char": np.int8, "int8_t": np.int8, "uchar": np.uint8, "uint8_t": np.uint8,
    "short": np.int16, "int16_t": np.int16, "ushort": np.uint16, "uint16_t": np.uint16,
    "int": np.int32, "int32_t": np.int32, "uint": np.uint32, "uint32_t": np.uint32, "unsigned": np.uint32,
    "long": np.int64, "int64_t": np.int64, "ulong": np.uint64, "uint64_t": np.uint64,
    "float": np.float32, "half": np.float16,
}


def _function_constants(prog, values: Mapping):
    """ctypes arrays (indices, 8 bytes of value each) for a dispatch."""
    declared = prog.unit.function_constants
    by_name = {fc.name: fc for fc in declared.values()}
    index = (ctypes.c_int32 * max(len(values), 1))()
    data = (ctypes.c_uint8 * (8 * max(len(values), 1)))()
    for i, (key, value) in enumerate(values.items()):
        fc = by_name.get(key) if isinstance(key, str) else declared.get(int(key))
        if fc is None:
            raise ValueError(f"function_constants: {prog.path.name} declares no function constant {key!r}; "
                             f"it has {sorted((c.index, c.name) for c in declared.values())}")
        dtype = _CONSTANT_DTYPES.get(fc.type)
        if dtype is None:
            raise TypeError(f"function_constants: cannot pack a value of type '{fc.type}' for {fc.name}")
        raw = np.asarray(value, dtype=dtype).tobytes()
        index[i] = fc.index
        ctypes.memmove(ctypes.addressof(data) + 8 * i, raw, len(raw))
    return index, data


def _relative(loc: str) -> str:
    try:
        path, rest = loc.rsplit(":", 1)
        return f"{Path(path).resolve().relative_to(ROOT)}:{rest}"
    except (ValueError, OSError):
        return loc
