"""One definition of coordinate keys for every backend (metal/lattice_keys.h).

The extension embeds the header's text for the CUDA kernels, and the header
compiled three ways, as the host's C++, as its CUDA branch (NVRTC's
language, compiled here by the host compiler with __device__ blank) and as
Metal (through the harness, which is as strict as Apple's compiler), gives
the range checks, keys, hashes and unpacked coordinates of a reference
written here from the documented layout.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mlx_lattice import _ext

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "metal" / "lattice_keys.h"
PROBE = Path(__file__).resolve().parent / "lattice_keys"
M64 = (1 << 64) - 1


def _constant(name: str) -> int:
    return int(re.search(rf"\b{name} = (-?\d+);", HEADER.read_text()).group(1))


BATCH_LIMIT, COORD_MIN, COORD_MAX = (_constant(n) for n in ("kBatchLimit", "kCoordMin", "kCoordMax"))


def coordinates(rng) -> np.ndarray:
    """(N, 4) rows: the range's corners, rows just outside it, random rows."""
    lo, hi, top = COORD_MIN, COORD_MAX, BATCH_LIMIT - 1
    fixed = [
        (0, lo, lo, lo), (top, hi, hi, hi), (1, -1, 0, 1), (7, 0, 0, 0), (0, 3, 2, 1), (0, 3, 2, 2),
        (BATCH_LIMIT, 0, 0, 0), (-1, 0, 0, 0), (0, hi + 1, 0, 0), (0, 0, lo - 1, 0), (0, 0, 0, hi + 1),
    ]
    rand = np.concatenate(
        [rng.integers(0, BATCH_LIMIT, (200, 1)), rng.integers(lo, hi + 1, (200, 3))], axis=1
    )
    return np.concatenate([np.array(fixed), rand]).astype(np.int32)


def reference(rows: np.ndarray) -> list[tuple[int, ...]]:
    """(in_range, key, hash, b, x, y, z unpacked) per row, from the layout:
    batch << 51 | (x - MIN) << 34 | (y - MIN) << 17 | (z - MIN)."""

    def mix(key):
        x = key >> 2
        x ^= x >> 31
        x = (x * 0x7FB5D329728EA185) & M64
        x ^= x >> 27
        x = (x * 0x81DADEF4BC2DD44D) & M64
        return x ^ (x >> 33)

    out = []
    for b, x, y, z in rows.tolist():
        ok = 0 <= b < BATCH_LIMIT and all(COORD_MIN <= v <= COORD_MAX for v in (x, y, z))
        key = (b << 51) | ((x - COORD_MIN) << 34) | ((y - COORD_MIN) << 17) | (z - COORD_MIN) if ok else M64
        h = ((mix(key) << 2) & M64) | (key & 3)
        unpacked = [key >> 51] + [((key >> s) & 0x1FFFF) + COORD_MIN for s in (34, 17, 0)]
        out.append((int(ok), key, h, *unpacked))
    return out


def test_embedded_source_is_the_header():
    # A stale build (the header edited, the extension not rebuilt) fails here.
    assert _ext.lattice_keys_source() == HEADER.read_text()


def test_extension_range_is_the_headers():
    assert (_ext.BATCH_LIMIT, _ext.COORD_MIN, _ext.COORD_MAX) == (BATCH_LIMIT, COORD_MIN, COORD_MAX)


def test_reference_orders_keys_as_coordinates(rng):
    rows = coordinates(rng)[:6]
    keys = [r[1] for r in reference(rows)]
    assert sorted(range(6), key=lambda i: keys[i]) == sorted(range(6), key=lambda i: tuple(rows[i]))


def _compiler() -> str:
    for cmd in ("c++", "g++", "clang++"):
        if shutil.which(cmd):
            return cmd
    pytest.skip("no C++ compiler")


@pytest.mark.parametrize(
    "branch, flags",
    [("host", []), ("cuda", ["-D__CUDACC_RTC__", "-D__device__="])],
)
def test_cpp_and_cuda_branches_match_the_reference(tmp_path, rng, branch, flags):
    exe = tmp_path / f"probe_{branch}"
    build = subprocess.run(
        [_compiler(), "-std=c++17", "-Wall", "-Wextra", "-Werror", *flags, str(PROBE / "probe.cpp"), "-o", str(exe)],
        capture_output=True, text=True,
    )
    assert build.returncode == 0, build.stderr
    rows = coordinates(rng)
    run = subprocess.run(
        [str(exe)], input="\n".join(" ".join(map(str, r)) for r in rows.tolist()),
        capture_output=True, text=True, check=True,
    )
    got = [tuple(int(v) for v in line.split()) for line in run.stdout.splitlines()]
    assert got == reference(rows)


@pytest.mark.metal
def test_metal_branch_matches_the_reference(rng):
    import metal_harness as mh

    ok, why = mh.available()
    if not ok:
        pytest.skip(why)
    rows = coordinates(rng)
    n = len(rows)
    in_ranges, keys, hashes, unpacked = mh.run_kernel(
        PROBE / "probe.metal", "lattice_keys_probe",
        [rows, np.zeros(n, np.int32), np.zeros(n, np.uint64), np.zeros(n, np.uint64), np.zeros((n, 4), np.int32)],
        [n], groups=((n + 31) // 32, 1, 1), threads=(32, 1, 1),
    )[1:]
    got = [
        (int(r), int(k), int(h), *map(int, u))
        for r, k, h, u in zip(in_ranges.tolist(), keys.tolist(), hashes.tolist(), unpacked.tolist())
    ]
    assert got == reference(rows)
