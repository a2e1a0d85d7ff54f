"""Compile check of the Mac build's host C++, on Linux.

Every translation unit of the extension (LATTICE_SOURCES in CMakeLists.txt)
is compiled with -fsyntax-only as a Mac build with Metal compiles it: the
compile definitions CMakeLists.txt gives the extension when the Metal
libraries are built (MLX_LATTICE_METAL, MLX_LATTICE_TENSOROPS), the flags
MLX's CMake config adds on macOS (MLXConfig.cmake's MLX_CXX_FLAGS), the same
C++ standard, MLX's real headers including mlx/backend/metal/*.h, and, for
Apple's metal-cpp, the declarations-only stand-in in include/ (see README.md).

Clang is preferred (Apple's compiler is a Clang), with libc++ when it is
installed (Apple's standard library: a header that libstdc++ pulls in
transitively and libc++ does not shows as a missing include, as on a Mac).

A unit that compiled is remembered under build/mac-host-check/ with a digest
of the command, the compiler's version and every file the compiler read (its
dependency list), so it is compiled again only when one of them changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sysconfig
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import mlx

ROOT = Path(__file__).resolve().parent.parent.parent
STANDIN = Path(__file__).resolve().parent / "include"
CACHE = ROOT / "build" / "mac-host-check"

# Oldest releases accepted: the C++20 the sources use (Clang 15, GCC 12).
MINIMUM = {"clang": 15, "gcc": 12}


def _cmake() -> str:
    return (ROOT / "CMakeLists.txt").read_text()


def _cmake_list(text: str, name: str) -> list[str]:
    start = text.index(f"set({name}")
    body = text[start + len(f"set({name}") : text.index(")", start)]
    return body.split()


def sources() -> list[Path]:
    """The extension's translation units, as CMakeLists.txt lists them."""
    return [ROOT / name for name in _cmake_list(_cmake(), "LATTICE_SOURCES")]


def _library_definitions() -> list[tuple[str, list[str]]]:
    """(condition, definitions): each target_compile_definitions(_ext ...)
    under an if(LATTICE_<library>_BUILT) of CMakeLists.txt, in order."""
    found = re.findall(
        r"if\((LATTICE_\w+_BUILT)\)\s*target_compile_definitions\(_ext\s+PRIVATE\s+([^)]*)\)", _cmake()
    )
    return [(cond, defs.split()) for cond, defs in found]


def metal_definitions() -> list[str]:
    """The definitions of a Mac build with every Metal library built."""
    return [d for _, defs in _library_definitions() for d in defs]


def configurations() -> dict[str, list[str]]:
    """The Mac builds with Metal, by the libraries built, each with its
    definitions. A library is built only when the ones before it are (the
    TensorOps library needs mlx_lattice.metallib), so the builds are the
    prefixes of the list: {"metal": [MLX_LATTICE_METAL=1], "metal+tensorops":
    [MLX_LATTICE_METAL=1, MLX_LATTICE_TENSOROPS=1]}."""
    out, names, defs = {}, [], []
    for cond, more in _library_definitions():
        names.append(cond.removeprefix("LATTICE_").removesuffix("_BUILT").lower())
        defs = defs + more
        out["+".join(names)] = defs
    return out


def conditional_units(units: list[Path], definitions: list[str]) -> list[Path]:
    """The units whose text changes with `definitions`: those that name one
    of them, or all when a header under src/ or metal/ names one."""
    names = [d.split("=")[0] for d in definitions]
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    headers = [*(ROOT / "src").rglob("*.h"), *(ROOT / "metal").glob("*.h")]
    if any(pattern.search(h.read_text()) for h in headers):
        return list(units)
    return [u for u in units if pattern.search(u.read_text())]


def cxx_standard() -> str:
    """-std value of the build: CMAKE_CXX_STANDARD, with GNU extensions
    unless CMAKE_CXX_EXTENSIONS is OFF (CMake's default is ON)."""
    text = _cmake()
    std = re.search(r"set\(CMAKE_CXX_STANDARD\s+(\d+)\)", text).group(1)
    plain = re.search(r"set\(CMAKE_CXX_EXTENSIONS\s+OFF\)", text)
    return f"{'c' if plain else 'gnu'}++{std}"


def nanobind_definitions() -> list[str]:
    """nanobind_add_module's NB_DOMAIN, as the module is compiled with it."""
    domain = re.search(r"nanobind_add_module\([^)]*\bNB_DOMAIN\s+(\w+)", _cmake())
    return [f"NB_DOMAIN={domain.group(1)}"] if domain else []


def mlx_include() -> Path:
    return Path(list(mlx.__path__)[0]) / "include"


def mlx_mac_flags() -> list[str]:
    """The flags MLX's CMake config adds to its target on macOS (each
    `set(MLX_CXX_FLAGS ${MLX_CXX_FLAGS} -D...)`; the Linux wheel carries the
    same file with those branches switched off)."""
    config = Path(list(mlx.__path__)[0]) / "share" / "cmake" / "MLX" / "MLXConfig.cmake"
    return re.findall(r"set\(MLX_CXX_FLAGS \$\{MLX_CXX_FLAGS\} (-D\w+)\)", config.read_text())


def nanobind_include() -> Path | None:
    try:
        import nanobind
    except ImportError:
        return None
    return Path(nanobind.include_dir())


@dataclass(frozen=True)
class Compiler:
    command: str
    kind: str  # "clang" or "gcc"
    version: str  # first line of --version
    stdlib: tuple[str, ...]  # ("-stdlib=libc++",) or ()

    def describe(self) -> str:
        lib = "libc++" if self.stdlib else "libstdc++"
        return f"{self.command} [{self.version}] with {lib}"


def _run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}, **kw)


def _identify(cmd: str):
    try:
        out = _run([cmd, "--version"], timeout=30)
    except OSError:
        return None
    if out.returncode != 0:
        return None
    first = out.stdout.splitlines()[0] if out.stdout else ""
    kind = "clang" if "clang" in first.lower() else "gcc" if "Free Software Foundation" in out.stdout else None
    major = re.search(r"(\d+)\.\d+\.\d+", first)
    if kind is None or major is None:
        return None
    return kind, int(major.group(1)), first


def _has_libcxx(cmd: str) -> bool:
    probe = "#include <mutex>\n#include <vector>\n#include <filesystem>\n"
    out = subprocess.run(
        [cmd, "-x", "c++", "-std=c++20", "-stdlib=libc++", "-fsyntax-only", "-"],
        input=probe, capture_output=True, text=True, timeout=60,
    )
    return out.returncode == 0


@lru_cache(maxsize=None)
def find_compiler() -> Compiler | str:
    """The compiler of the check, or why there is none: the newest Clang
    (>= 15), with libc++ when it has it, else the newest GCC (>= 12)."""
    best: dict[str, tuple[int, str, str]] = {}
    candidates = [f"clang++-{v}" for v in range(25, MINIMUM["clang"] - 1, -1)] + ["clang++"]
    candidates += [f"g++-{v}" for v in range(20, MINIMUM["gcc"] - 1, -1)] + ["g++"]
    # MLX_LATTICE_MACHOST_CXX names the compiler instead (e.g. g++ for a run
    # with GCC where Clang is installed).
    chosen = os.environ.get("MLX_LATTICE_MACHOST_CXX", "")
    if chosen:
        candidates = [chosen]
    for cmd in candidates:
        if shutil.which(cmd) is None:
            continue
        found = _identify(cmd)
        if found is None:
            continue
        kind, major, first = found
        if major >= MINIMUM[kind] and (kind not in best or major > best[kind][0]):
            best[kind] = (major, cmd, first)
    if "clang" in best:
        _, cmd, first = best["clang"]
        return Compiler(cmd, "clang", first, ("-stdlib=libc++",) if _has_libcxx(cmd) else ())
    if "gcc" in best:
        _, cmd, first = best["gcc"]
        return Compiler(cmd, "gcc", first, ())
    return f"no C++ compiler for the check: needs clang++ >= {MINIMUM['clang']} or g++ >= {MINIMUM['gcc']}"


def flags(compiler: Compiler, definitions: list[str] | None = None) -> list[str]:
    """Everything but the source: the Mac build's language, definitions
    (those of every Metal library unless given) and include directories,
    MLX's headers and the metal-cpp stand-in."""
    definitions = metal_definitions() if definitions is None else definitions
    args = [f"-std={cxx_standard()}", "-fsyntax-only", *compiler.stdlib]
    args += [f"-D{d}" for d in definitions + nanobind_definitions()]
    args += mlx_mac_flags()
    args += ["-I", str(ROOT / "src")]
    includes = [STANDIN, mlx_include()]
    nb = nanobind_include()
    if nb is not None:
        includes += [nb, Path(sysconfig.get_paths()["include"])]
    for d in includes:
        args += ["-isystem", str(d)]
    return args


@dataclass
class Result:
    source: Path
    ok: bool
    output: str
    cached: bool = False


_file_hashes: dict[tuple[str, int, int], str] = {}


def _file_hash(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _file_hashes:
        _file_hashes[key] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return _file_hashes[key]


def _digest(command: list[str], version: str, deps: list[str]) -> str | None:
    h = hashlib.sha256("\0".join([version, *command]).encode())
    for d in deps:
        fh = _file_hash(d)
        if fh is None:
            return None
        h.update(f"\0{d}\0{fh}".encode())
    return h.hexdigest()


def _parse_deps(text: str) -> list[str]:
    """The prerequisites of a Makefile rule written by -MD -MT dep."""
    body = text.replace("\\\n", " ").partition("dep:")[2]
    return [t.replace("\\ ", " ") for t in re.findall(r"(?:\\ |\S)+", body)]


def compile_unit(
    source: Path,
    compiler: Compiler,
    extra: tuple[str, ...] = (),
    cache: bool = True,
    definitions: list[str] | None = None,
) -> Result:
    """Syntax-checks one file with the check's flags (plus `extra`)."""
    command = [compiler.command, *flags(compiler, definitions), *extra, str(source)]
    entry = CACHE / (hashlib.sha256("\0".join(command).encode()).hexdigest()[:24] + ".json")
    if cache and entry.exists():
        saved = json.loads(entry.read_text())
        if _digest(command, compiler.version, saved["deps"]) == saved["digest"]:
            return Result(source, True, "", cached=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    depfile = entry.with_suffix(f".{os.getpid()}.{threading.get_ident()}.d")
    try:
        out = _run([*command, "-MD", "-MT", "dep", "-MF", str(depfile)], cwd=ROOT, timeout=600)
        ok = out.returncode == 0
        if ok and cache:
            deps = _parse_deps(depfile.read_text())
            digest = _digest(command, compiler.version, deps)
            if digest is not None:
                tmp = entry.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
                tmp.write_text(json.dumps({"source": str(source), "deps": deps, "digest": digest}))
                tmp.replace(entry)
    finally:
        depfile.unlink(missing_ok=True)
    return Result(source, ok, out.stdout + out.stderr)


def plan(units: list[Path]) -> list[tuple[str, Path]]:
    """(build, unit) pairs to compile: every unit as the build with every
    Metal library compiles it, and the units that differ in the other
    builds (today src/metal/program.cpp without TensorOps) in those too."""
    builds = configurations()
    full = list(builds)[-1]
    pairs = [(full, u) for u in units]
    for name, defs in builds.items():
        if name != full:
            pairs += [(name, u) for u in conditional_units(units, metal_definitions())]
    return pairs


def check_all(units: list[Path], compiler: Compiler, jobs: int | None = None) -> dict[tuple[str, Path], Result]:
    """compile_unit over plan(units), as many at once as there are cores."""
    jobs = jobs or os.cpu_count() or 2
    builds = configurations()
    pairs = plan(units)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = pool.map(lambda p: compile_unit(p[1], compiler, definitions=builds[p[0]]), pairs)
        return dict(zip(pairs, results))


if __name__ == "__main__":
    # python tests/machost/check.py: the check without pytest.
    import sys

    found = find_compiler()
    if isinstance(found, str):
        sys.exit(found)
    print(f"compiler: {found.describe()}")
    failed = 0
    for (build, src), res in check_all(sources(), found).items():
        status = "ok (cached)" if res.cached else "ok" if res.ok else "FAILED"
        print(f"{src.relative_to(ROOT)} [{build}]: {status}")
        if not res.ok:
            failed += 1
            print(res.output)
    sys.exit(1 if failed else 0)
