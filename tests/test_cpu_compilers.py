"""The CPU kernels give the same bits whichever compiler built them.

The kernels fuse exactly the multiply-adds written as simd::fma and are
compiled without floating-point contraction (src/cpu/simd.h,
CMakeLists.txt), so results may not depend on a compiler's choices.
tests/compilers/kernel_bits.cpp (a standalone program: the kernel sources,
the thread pool and MLX's header-only half types) prints a digest of each
kernel's results on fixed problems; it is built with GCC and with Clang for
every path this machine supports, with the kernels' flags, and run. Each
path's digests must agree across the compilers, and avx2's with avx512's
except attention (its query blocks follow the vector width); the forward
with edges from offset groups must agree with it grouped per block. Binaries are
cached by the hash of their sources, compiler and flags.

By hand: CC=clang CXX=clang++ pip install -e ".[test]" builds the extension
itself with Clang (see docs/architecture.md).
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import mlx
import pytest

from mlx_lattice import _ext

from conftest import cpu_kernel_sources

ROOT = Path(__file__).resolve().parent.parent
SOURCES = cpu_kernel_sources() + [ROOT / "src/core/threadpool.cpp", ROOT / "tests/compilers/kernel_bits.cpp"]
HEADERS = sorted((ROOT / "src/cpu").glob("*.h")) + [ROOT / "src/core/threadpool.h"]
CACHE = ROOT / "build" / "compiler-bits"
# The kernels' own flags (CMakeLists.txt) at -O2: without contraction no
# optimisation level changes a result.
FLAGS = ["-std=c++20", "-O2", "-ffp-contract=off"]
PATH_IDS = {"baseline": 0, "avx2": 1, "avx512": 2, "neon": 3}
# Results that follow the vector width (may differ between avx2 and avx512).
WIDTH_DEPENDENT = ("attention/",)


def _version(cmd):
    """`cmd --version`'s output, or (None, why not)."""
    try:
        out = subprocess.run([cmd, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{cmd} --version could not run: {e}"
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip()[-300:]
        return None, f"{cmd} --version exited {out.returncode}: {tail}"
    return out.stdout, ""


# Oldest releases that compile the kernels (C++20 lambdas capturing
# structured bindings: Clang 16).
MINIMUM = {"gcc": 11, "clang": 16}


def _compilers():
    """{"gcc" / "clang": (command, first line of --version)}: the newest of
    each found, or a string saying why one is unusable."""
    found, broken = {}, []
    candidates = [os.environ.get("CXX", ""), "g++", "clang++"]
    candidates += [f"g++-{v}" for v in range(10, 16)] + [f"clang++-{v}" for v in range(14, 22)]
    for cmd in candidates:
        if not cmd or shutil.which(cmd) is None:
            continue
        version, why = _version(cmd)
        if version is None:
            broken.append(why)
            continue
        first = version.splitlines()[0] if version.strip() else ""
        kind = "clang" if "clang" in first.lower() else "gcc" if "Free Software Foundation" in version else None
        major = re.search(r"(\d+)\.\d+\.\d+", first)
        if kind is None or major is None:
            broken.append(f"{cmd} --version names no GCC or Clang release: {first!r}")
            continue
        major = int(major.group(1))
        if kind not in found or major > found[kind][0]:
            found[kind] = (major, cmd, first)
    result = {}
    for kind, name in (("gcc", "g++"), ("clang", "clang++")):
        if kind not in found:
            result[kind] = f"no {name} found" + "".join(f" ({why})" for why in broken)
        elif found[kind][0] < MINIMUM[kind]:
            result[kind] = f"{found[kind][2]} is older than {kind} {MINIMUM[kind]}"
        else:
            result[kind] = found[kind][1:]
    return result


def _build(kind, cmd, version, isa):
    include = Path(list(mlx.__path__)[0]) / "include"
    args = [*FLAGS, f"-DLATTICE_ISA_ID={PATH_IDS[isa]}", f"-DLATTICE_ISA_NAME={isa}"]
    digest = hashlib.sha256()
    for f in SOURCES + HEADERS:
        digest.update(f.read_bytes())
    digest.update(" ".join([version, *args]).encode())
    binary = CACHE / f"kernel_bits-{kind}-{isa}-{digest.hexdigest()[:16]}"
    if binary.exists():
        return binary, None
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_suffix(f".tmp{os.getpid()}")
    proc = subprocess.Popen(
        [cmd, *args, f"-I{ROOT / 'src'}", f"-I{include}", *map(str, SOURCES), "-o", str(tmp), "-lpthread"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    return binary, (proc, tmp)


def _digests(binary):
    """{case: 16-hex-digit digest} from kernel_bits' "case digest" lines."""
    out = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{binary.name} exited {out.returncode}:\n{out.stderr[-2000:]}"
    lines = {}
    for line in out.stdout.splitlines():
        m = re.fullmatch(r"(\S+) ([0-9a-f]{16})", line.strip())
        assert m, f"{binary.name} printed {line!r}, not `<case> <16 hex digits>`"
        assert m.group(1) not in lines, f"{binary.name} printed case {m.group(1)} twice"
        lines[m.group(1)] = m.group(2)
    assert lines, f"{binary.name} printed no digest"
    return lines


def test_kernels_bitwise_across_compilers():
    compilers = _compilers()
    unusable = [why for why in compilers.values() if isinstance(why, str)]
    if unusable:
        pytest.skip(f"needs GCC >= {MINIMUM['gcc']} and Clang >= {MINIMUM['clang']}: {'; '.join(unusable)}")
    include = Path(list(mlx.__path__)[0]) / "include"
    if not (include / "mlx/types/half_types.h").exists():
        pytest.skip(f"MLX's headers are not installed at {include} (install mlx[cpu])")
    paths = [p for p in _ext.supported_cpu_isas() if p in PATH_IDS]
    # Build everything at once (the machine's cores), then run.
    builds = {}
    for kind, (cmd, version) in compilers.items():
        for isa in paths:
            builds[kind, isa] = _build(kind, cmd, version, isa)
    for (kind, isa), (binary, pending) in builds.items():
        if pending:
            proc, tmp = pending
            log = proc.communicate(timeout=600)[0]
            assert proc.returncode == 0, f"{compilers[kind][0]} ({isa}):\n{log[-4000:]}"
            tmp.replace(binary)
    results = {key: _digests(binary) for key, (binary, _) in builds.items()}
    for isa in paths:
        gcc, clang = results["gcc", isa], results["clang", isa]
        assert gcc.keys() == clang.keys()
        differ = sorted(k for k in gcc if gcc[k] != clang[k])
        assert not differ, f"{isa}: GCC and Clang differ on {differ}"
        # the row-major traversal (cpu.row_gather) sums as the grouped one
        rows = {k: v for k, v in gcc.items() if k.startswith("gather_conv_rows/")}
        assert rows and all(v == gcc[k.replace("_rows/", "_rows_grouped/")] for k, v in rows.items()), isa
        # edges taken from the relation's offset groups sum as those grouped per block
        groups = {k: v for k, v in gcc.items() if "_offset_groups/" in k}
        assert groups and all(v == gcc[k.replace("_offset_groups/", "/")] for k, v in groups.items()), isa
    if {"avx2", "avx512"} <= set(paths):
        for kind in compilers:
            a, b = results[kind, "avx2"], results[kind, "avx512"]
            differ = sorted(k for k in a if a[k] != b[k] and not k.startswith(WIDTH_DEPENDENT))
            assert not differ, f"{kind}: avx2 and avx512 differ on {differ}"
    if "baseline" in paths and "avx2" in paths:
        # the baseline rounds products apart: the digests do see the difference
        assert results["gcc", "baseline"] != results["gcc", "avx2"]


def _stub(path, body):
    path.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    path.chmod(0o755)
    return path


def test_digests_are_parsed_strictly(tmp_path):
    ok = _stub(tmp_path / "ok", "print('gather_conv/f32 0123456789abcdef')\nprint('adam 00000000ffffffff')")
    assert _digests(ok) == {"gather_conv/f32": "0123456789abcdef", "adam": "00000000ffffffff"}
    for body, message in [
        ("print('gather_conv/f32 0123456789abcdef extra')", r"not `<case> <16 hex digits>`"),
        ("print('Segmentation fault')", r"printed 'Segmentation fault'"),
        ("pass", r"printed no digest"),
        ("print('a 0123456789abcdef')\nprint('a 0123456789abcdef')", r"case a twice"),
        ("sys.stderr.write('boom'); sys.exit(3)", r"exited 3:\s+boom"),
    ]:
        with pytest.raises(AssertionError, match=message):
            _digests(_stub(tmp_path / "bad", body))


def test_a_compiler_whose_version_fails_is_named(tmp_path, monkeypatch):
    _stub(tmp_path / "g++", "sys.stderr.write('g++: fatal error: no cc1plus'); sys.exit(4)")
    _stub(tmp_path / "clang++", "print('Some Other Compiler 1.2')")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    found = _compilers()
    assert "g++ --version exited 4: g++: fatal error: no cc1plus" in found["gcc"]
    assert "clang++ --version names no GCC or Clang release: 'Some Other Compiler 1.2'" in found["clang"]
