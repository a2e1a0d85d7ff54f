"""mlx_lattice: spatially sparse 3D convolution for MLX."""

try:
    import mlx.core  # noqa: F401  (loads libmlx first, so the extension links to it wherever it lives)
except ImportError as e:  # on Linux the mlx wheel alone has no backend (no libmlx.so)
    raise ImportError(
        "mlx_lattice needs MLX with a backend, and `import mlx.core` failed "
        f"({e}). On Linux install one: `pip install \"mlx_lattice[cpu]\"` (MLX's CPU "
        "backend) or `pip install \"mlx_lattice[cuda]\"` (NVIDIA GPUs, CUDA 13); from a "
        "clone, `pip install -e \".[cpu]\"`. On macOS `pip install mlx` brings Metal."
    ) from e



def _check_mlx_release() -> None:
    """The extension runs only beside the MLX release it was compiled
    against (it links libmlx and subclasses its C++ classes): a clear error
    here instead of a crash or a missing symbol inside the extension."""
    import importlib.metadata
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.find_spec(f"{__name__}._ext")
    if spec is None or spec.origin is None:
        return  # the import below says what is missing
    try:
        built = json.loads((Path(spec.origin).parent / "build_info.json").read_text()).get("mlx_version")
        installed = importlib.metadata.version("mlx")
    except (OSError, ValueError, importlib.metadata.PackageNotFoundError):
        return
    if built and built != installed:
        raise ImportError(
            f"mlx_lattice was built against MLX {built}, but MLX {installed} is installed; the "
            "extension runs only with the release it was compiled against. Either reinstall "
            "mlx_lattice, which builds against the installed MLX when it is a supported release "
            f"(from a clone: pip install --no-deps --force-reinstall -e .), or `pip install mlx=={built}`"
        )


_check_mlx_release()

# Most CPU threads MLX_LATTICE_NUM_THREADS may ask for: more than any host
# has cores, and far inside the C int the extension keeps the count in.
_MAX_THREADS = 4096


def _check_thread_count_variable() -> None:
    """MLX_LATTICE_NUM_THREADS, checked before the extension reads it: its C
    parse takes any text (``abc`` as unset, ``4x`` as 4, a number past
    int's range as garbage), so a bad value fails the import here, as a bad
    MLX_LATTICE_CPU_ISA does. 0, empty or unset: every core."""
    import os
    import re

    v = os.environ.get("MLX_LATTICE_NUM_THREADS", "").strip()
    if v and not (re.fullmatch(r"\+?[0-9]{1,5}", v) and 0 <= int(v) <= _MAX_THREADS):
        raise ImportError(f"MLX_LATTICE_NUM_THREADS={v!r}: expected a whole number of CPU threads "
                          f"from 1 to {_MAX_THREADS} (0, empty or unset: every core)")


_check_thread_count_variable()

# Each backend's routes, registered in this order (within a backend, equal
# priorities are taken in registration order), before any module reads the
# registry (the tuner checks forced routes at import).
from .backends import cpu_routes, metal_routes, cuda_routes  # noqa: E402,F401,I001
from . import _ext, diagnostics, ops, routes  # noqa: E402

_ext.num_threads()  # the thread pool reads its variable now, at import, not at the first call
from .manager import CoordinateManager, CoordinateSet
from .quantized import QuantizedWeight
from .relation import MAP_KINDS, KernelGeometry, Relation
from .tensor import SparseTensor

__version__ = "0.1.0"

COORD_RANGE = {"batch": (0, _ext.BATCH_LIMIT - 1), "xyz": (_ext.COORD_MIN, _ext.COORD_MAX)}


def num_threads() -> int:
    """Threads used by the CPU kernels and map building."""
    return _ext.num_threads()


def set_num_threads(n: int) -> None:
    """Set the CPU thread count (default: all cores, or MLX_LATTICE_NUM_THREADS)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    _ext.set_num_threads(n)


__all__ = [
    "SparseTensor",
    "QuantizedWeight",
    "CoordinateManager",
    "CoordinateSet",
    "Relation",
    "KernelGeometry",
    "MAP_KINDS",
    "COORD_RANGE",
    "ops",
    "routes",
    "diagnostics",
    "num_threads",
    "set_num_threads",
]

# Model-level surface: layers, pooling, point <-> voxel conversion, algebra, networks.
from . import algebra, convert, coordsets, decoder, models, neighbors, nn, pooling  # noqa: E402
from .algebra import (  # noqa: E402
    add,
    cat,
    crop,
    from_dense,
    maximum,
    minimum,
    mul,
    prune,
    sparse_collate,
    sub,
    to_dense,
    top_k,
)
from .coordsets import contains, intersection, lookup, union  # noqa: E402
from .decoder import downsample, expand, prune_by_logits, upsample  # noqa: E402
from .pooling import pool_transpose3d  # noqa: E402
from .points import devoxelize, sparse_quantize, voxelize  # noqa: E402
from .compile import sparse_compile  # noqa: E402

__all__ += [
    "nn",
    "models",
    "algebra",
    "pooling",
    "convert",
    "neighbors",
    "to_dense",
    "from_dense",
    "cat",
    "add",
    "sub",
    "mul",
    "maximum",
    "minimum",
    "prune",
    "crop",
    "top_k",
    "coordsets",
    "decoder",
    "lookup",
    "contains",
    "union",
    "intersection",
    "expand",
    "downsample",
    "prune_by_logits",
    "upsample",
    "pool_transpose3d",
    "sparse_collate",
    "sparse_quantize",
    "voxelize",
    "devoxelize",
    "sparse_compile",
]
