"""MLX's Metal kernels held to the harness: every kernel header of the
mlx-metal wheel (tests/mlx_metal_wheel.py) passes the strict pass as MLX
instantiates it (our programs in tests/metal/mlx_kernels/, modelled on MLX's
.metal files), MLX's steel and NAX GEMMs and quantized matmul run on the
executor and agree with NumPy, and defective variants of MLX's kernels
(test_metal_strict_mutants.py's operators) are rejected.

MLX compiles these sources on every Mac: a rejection here is the harness
refusing valid MSL, a disagreement with NumPy the harness's model of the
hardware differing from what shipped code relies on.

Without the wheel (no network, no cache) the tests skip, unless
MLX_LATTICE_REQUIRE_MLX_METAL=1, where they fail.
"""

from __future__ import annotations

import hashlib
import os
import re
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

import mlx_metal_wheel

try:
    import metal_harness as mh
    from metal_harness import build, strict
    import test_metal_strict_mutants as mutation
except ImportError:  # tests/ imported as a package
    from tests.metal import metal_harness as mh
    from tests.metal import test_metal_strict_mutants as mutation
    from tests.metal.metal_harness import build, strict

_ok, _why = mh.available()
pytestmark = [pytest.mark.metal, pytest.mark.skipif(not _ok, reason=_why)]

PROGRAMS_DIR = Path(__file__).resolve().parent / "mlx_kernels"
PROGRAMS = sorted(PROGRAMS_DIR.glob("*.metal"))
REQUIRE = os.environ.get("MLX_LATTICE_REQUIRE_MLX_METAL") == "1"
# MLX's kernels build at the language version of its deployment target (3.1
# for the macOS 14 wheel); the NAX ones at 4.0, which a program names on a
# line `// Language: Metal 4.0.`
MLX_METAL_STD = 310


@lru_cache(maxsize=None)
def include_dir() -> Path:
    inc = mlx_metal_wheel.include_dir()
    if inc is None:
        why = f"MLX's macOS wheel is not available: {mlx_metal_wheel.reason()}"
        if REQUIRE:
            pytest.fail(f"{why} (MLX_LATTICE_REQUIRE_MLX_METAL=1)")
        pytest.skip(why)
    return inc


def kernels_dir() -> Path:
    return include_dir() / "mlx" / "backend" / "metal" / "kernels"


def version_of(program: Path) -> int:
    m = re.search(r"Language: Metal (\d)\.(\d)", program.read_text())
    return int(m.group(1)) * 100 + int(m.group(2)) * 10 if m else MLX_METAL_STD


@lru_cache(maxsize=None)
def scanned(program: Path) -> str:
    return build.scan(program, [include_dir()], version_of(program))


def headers_of(program: Path) -> set[str]:
    k = str(kernels_dir())
    return {str(Path(f).relative_to(k)) for f in re.findall(r'^# \d+ "([^"]+)"', scanned(program), re.M)
            if f.startswith(k)}


def test_the_programs_are_ours_and_name_their_version():
    # Our instantiation programs (MLX's .metal files are not copied here) and
    # the NAX ones at Metal 4.0.
    assert PROGRAMS
    for p in PROGRAMS:
        text = p.read_text()
        assert text.startswith("// MLX's"), p.name
        assert ("nax" in p.stem) == (version_of(p) == 400), p.name


def test_every_kernel_header_of_the_wheel_is_instantiated():
    headers = {str(p.relative_to(kernels_dir())) for p in kernels_dir().rglob("*.h")}
    assert len(headers) >= 90, sorted(headers)
    covered = set().union(*(headers_of(p) for p in PROGRAMS))
    assert headers - covered == set()


def _pass_digest() -> str:
    """What the strict pass's verdict depends on besides the unit: its code,
    the shim and the two preludes."""
    from metal_harness import analysis, opencl, source

    h = hashlib.sha256(strict._shim_digest().encode() + opencl._digest().encode())
    for module in (strict, analysis, source):
        h.update(Path(module.__file__).read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.stem)
def test_the_strict_pass_accepts_mlx(program):
    # Each stage stamps the build cache; a passing unit is stamped whole as
    # well, so that a warm run skips the source scan's rules too.
    text, version = scanned(program), version_of(program)
    key = hashlib.sha256((text + str(version) + _pass_digest()).encode()).hexdigest()[:24]
    stamp = build.cache_dir() / f"mlx-strict-{key}.ok"
    if stamp.exists():
        return
    assert strict.violations(text, version, build.cache_dir()) == []
    stamp.touch()


# ------------------------------------------------------------------ executor runs

GEMM_PARAMS = np.dtype({
    "names": ["M", "N", "K", "lda", "ldb", "ldd", "tiles_n", "tiles_m", "batch_stride_a", "batch_stride_b",
              "batch_stride_d", "swizzle_log", "gemm_k_iterations_aligned", "batch_ndim"],
    "formats": ["i4"] * 8 + ["i8"] * 3 + ["i4"] * 3,
}, align=True)  # steel/gemm/params.h's GEMMParams
DTYPES = ["float32", "float16", "bfloat16"]


def to_device(x: np.ndarray, dtype: str) -> np.ndarray:
    """Values as the kernel's buffer holds them (bfloat16 as its uint16 bits,
    rounded to nearest even)."""
    if dtype == "bfloat16":
        u = np.ascontiguousarray(x, np.float32).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.ascontiguousarray(x, {"float32": np.float32, "float16": np.float16}[dtype])


def from_device(y: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (y.astype(np.uint32) << 16).view(np.float32)
    return y.astype(np.float32)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


# The output's rounding: one ulp of the largest output, and a little more
# for the accumulation (float accumulators in every kernel here).
TOLERANCE = {"float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


def run_gemm(nax: bool, m: int, n: int, k: int, transpose_a: bool, transpose_b: bool, dtype: str,
             schedule: str = "forward", seed: int = 0):
    """MLX's steel (or NAX) GEMM dispatched as MLX's matmul.cpp dispatches
    it, and the float64 product of the same (rounded) operands."""
    bm, bn, bk, wm, wn = (64, 64, 256, 2, 2) if nax else (32, 32, 16, 2, 2)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    A = to_device(a.T if transpose_a else a, dtype)
    B = to_device(b.T if transpose_b else b, dtype)
    a_r, b_r = from_device(A, dtype), from_device(B, dtype)
    want = (a_r.T if transpose_a else a_r).astype(np.float64) @ (b_r.T if transpose_b else b_r).astype(np.float64)
    tiles_n, tiles_m = -(-n // bn), -(-m // bm)
    swizzle = 0 if tiles_m <= 3 else 1
    p = np.zeros((), GEMM_PARAMS)
    p["M"], p["N"], p["K"] = m, n, k
    p["lda"], p["ldb"], p["ldd"] = (m if transpose_a else k), (k if transpose_b else n), n
    p["tiles_n"], p["tiles_m"] = tiles_n, tiles_m
    p["batch_stride_a"], p["batch_stride_b"], p["batch_stride_d"] = m * k, k * n, m * n
    p["swizzle_log"], p["gemm_k_iterations_aligned"], p["batch_ndim"] = swizzle, k // bk, 1
    tile = 1 << swizzle
    name = (f"steel_gemm_fused_{'nax_' if nax else ''}{'t' if transpose_a else 'n'}{'t' if transpose_b else 'n'}"
            f"_{dtype}_{dtype}_bm{bm}_bn{bn}_bk{bk}_wm{wm}_wn{wn}")
    program = PROGRAMS_DIR / ("steel_gemm_nax_run.metal" if nax else "steel_gemm_run.metal")
    constants = {"has_batch": False, "use_out_source": False, "do_axpby": False,
                 "align_M": m % bm == 0, "align_N": n % bn == 0, "align_K": k % bk == 0}
    out = mh.run_kernel(program, name, {0: A, 1: B, 3: np.zeros((m, n), A.dtype), 4: p},
                        groups=(tiles_n * tile, -(-tiles_m // tile), 1), threads=(32, wn, wm),
                        include_dirs=[include_dir()], version=version_of(program), function_constants=constants,
                        schedule=schedule)
    return from_device(out[3], dtype), want


# (m, n, k): a whole tile, then M, N and K all off the tile (partial tiles on
# every edge and a K remainder), then a K shorter than one chunk.
AWKWARD = [(37, 45, 29), (70, 33, 50)]
TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_steel_gemm_agrees_with_numpy(dtype):
    got, want = run_gemm(False, 37, 45, 29, False, True, dtype, schedule="random")
    assert relative_error(got, want) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_nax_gemm_agrees_with_numpy(dtype):
    # TensorOps matmul2d on cooperative tensors, whose 16x16 fragment layout
    # MLX's NAX tiles read (the harness's former element-cyclic layout gave
    # errors of order 1 here).
    got, want = run_gemm(True, 37, 70, 300, True, False, dtype, schedule="random")
    assert relative_error(got, want) < TOLERANCE[dtype]


@pytest.mark.slow
@pytest.mark.parametrize("nax", [False, True], ids=["steel", "nax"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transpose", TRANSPOSES, ids=["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("shape", [(64, 64, 256), (32, 32, 16), *AWKWARD, (130, 64, 40)], ids=str)
def test_gemm_every_transpose_and_shape(nax, dtype, transpose, shape):
    for schedule in ("forward", "reverse", "random"):
        got, want = run_gemm(nax, *shape, *transpose, dtype, schedule=schedule)
        assert relative_error(got, want) < TOLERANCE[dtype], schedule


def quantize(w: np.ndarray, group: int, bits: int, dtype: str):
    """MLX's affine quantization of the rows of w: uint32 words of `bits`-bit
    values (lowest bits first), per-group scales and biases in `dtype`, and
    the dequantized matrix those give."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // group, group)
    lo, hi = g.min(-1), g.max(-1)
    levels = 2**bits - 1
    scales = to_device(np.maximum((hi - lo) / levels, 1e-7), dtype)
    biases = to_device(lo, dtype)
    s, b = from_device(scales, dtype), from_device(biases, dtype)
    q = np.clip(np.round((g - b[..., None]) / s[..., None]), 0, levels).astype(np.uint32)
    per_word = 32 // bits
    words = q.reshape(rows, cols // per_word, per_word)
    packed = np.zeros((rows, cols // per_word), np.uint32)
    for j in range(per_word):
        packed |= words[..., j] << np.uint32(bits * j)
    return packed, scales, biases, (s[..., None] * q + b[..., None]).reshape(rows, cols)


def run_qmm(m: int, n: int, k: int, bits: int, dtype: str, schedule: str = "forward", seed: int = 0):
    """x @ dequantize(w)^T through MLX's affine_qmm_t, dispatched as MLX's
    quantized.cpp does (32x32 tiles, 2x2 simdgroups)."""
    rng = np.random.default_rng(seed)
    x = to_device(rng.standard_normal((m, k)), dtype)
    packed, scales, biases, w = quantize(rng.standard_normal((n, k)).astype(np.float32), 64, bits, dtype)
    want = from_device(x, dtype).astype(np.float64) @ w.astype(np.float64).T
    aligned = "true" if n % 32 == 0 and bits == 4 else "false"
    i32, i64 = (lambda v: np.array([v], np.int32)), (lambda v: np.array([v], np.int64))
    program = PROGRAMS_DIR / "quantized_run.metal"
    out = mh.run_kernel(
        program, f"affine_qmm_t_{dtype}_gs_64_b_{bits}_alN_{aligned}_batch_0",
        {0: packed, 1: scales, 2: biases, 3: x, 4: np.zeros((m, n), x.dtype), 5: i32(k), 6: i32(n), 7: i32(m),
         8: i32(0), 9: i32(1), 10: i64(0), 11: i32(0), 12: i32(1), 13: i64(0), 14: i64(0), 15: i64(0)},
        groups=(-(-n // 32), -(-m // 32), 1), threads=(32, 2, 2), include_dirs=[include_dir()],
        version=version_of(program), schedule=schedule)
    return from_device(out[4], dtype), want


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantized_matmul_agrees_with_numpy(dtype):
    got, want = run_qmm(7, 45, 192, 4, dtype, schedule="random")
    assert relative_error(got, want) < TOLERANCE[dtype]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("shape", [(32, 64, 128), (7, 45, 192), (70, 33, 64)], ids=str)
def test_quantized_matmul_every_shape(dtype, bits, shape):
    for schedule in ("forward", "reverse", "random"):
        got, want = run_qmm(*shape, bits, dtype, schedule=schedule)
        assert relative_error(got, want) < TOLERANCE[dtype], schedule


# ------------------------------------------------------------------ mutants

# The programs mutated: small ones over MLX's main kernel families, with
# threadgroup memory, barriers and simdgroup matrices (each mutant runs the
# whole strict pass on a cold cache).
MUTATED = ["arange", "softmax", "sort", "scan", "reduce", "gemv", "hadamard", "steel_gemm_run", "steel_gemm_nax_run",
           "quantized_run"]
# Mutants that stay valid MSL, with why (none so far).
EQUIVALENT: dict[tuple[str, str], str] = {}


def mutants_of(program: Path):
    """(operator, kernel, mutated text, expected rule): each operator of
    test_metal_strict_mutants.py at the first kernel it applies to."""
    text = scanned(program)
    for op, rule in mutation.OPERATORS.items():
        for k in mutation.opencl.kernel_defs(text):
            mutant = op(text, k)
            if mutant is not None:
                yield op.__name__, k.name, mutant, rule
                break


@pytest.mark.slow
@pytest.mark.parametrize("stem", MUTATED)
def test_every_mutant_of_an_mlx_kernel_is_rejected(stem, tmp_path):
    program = PROGRAMS_DIR / f"{stem}.metal"
    made = list(mutants_of(program))
    assert len(made) >= 2, [m[0] for m in made]  # arange has no threadgroup memory, barrier or read-only buffer
    missed = []
    for op, kernel, mutant, rule in made:
        if (stem, op) in EQUIVALENT:
            continue
        found = strict.violations(mutant, version_of(program), tmp_path)
        if rule not in {v.rule for v in found}:
            missed.append(f"{op} on {kernel}: expected [{rule}], got {[str(v) for v in found[:3]]}")
    assert not missed, "\n".join(missed)
