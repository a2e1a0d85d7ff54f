"""The extension built for macOS arm64 on Linux, as a Mac build builds it.

The project's own CMake configure is run for the target (CMAKE_SYSTEM_NAME
Darwin, arm64, the deployment target of the Mac wheels), with zig's clang
as the compiler and MLX's CMake package from the macOS wheel `mlx-metal`
(tests/mlx_metal_wheel.py): the units, definitions and flags are what
CMakeLists.txt gives a Mac build, read from the configure's
compile_commands.json and its File API reply, never from a list here. Each
unit is compiled to a Mach-O arm64 object against Apple's metal-cpp and
MLX's headers from that wheel, and the extension is linked against the
wheel's libmlx.dylib; see README.md for every choice and its reason.

Three Mac builds are configured: both Metal libraries (`metal+tensorops`),
mlx_lattice.metallib alone (`metal`, as when the TensorOps library fails or
is switched off) and none (`cpu`, a Mac without the Metal toolchain). A
stand-in `xcrun` (stub-tools/) lets cmake/metal.cmake take the branch of a
Mac with the Metal toolchain; it compiles nothing.

`python tests/macbuild/mac_build.py` runs the build without pytest.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
for _p in (HERE, HERE.parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
import macho  # noqa: E402
import mlx_metal_wheel  # noqa: E402

STANDIN = HERE / "include"
STUB_TOOLS = HERE / "stub-tools"
SELFTEST = HERE / "selftest"
BUILD = ROOT / "build" / "mac-build"
# zig's own cache, which keeps the C++ runtime zig builds for the target
# (once, about 40 s of CPU). Under build/, so a clean clone's later runs
# reuse it; the units' objects are kept in OBJECTS (compile_unit).
ZIG_CACHE = BUILD / "zig-cache"
OBJECTS = BUILD / "objects"
MODULE = "_ext"
MINIMUM_CMAKE = (3, 25)

# The Mac builds with their configure options, and whether Xcode's Metal
# compiler is there (the stand-in xcrun on PATH).
CONFIGURATIONS = {
    "metal+tensorops": {"options": (), "metal_toolchain": True},
    "metal": {"options": ("-DMLX_LATTICE_TENSOROPS=OFF",), "metal_toolchain": True},
    "cpu": {"options": (), "metal_toolchain": False},
}
FULL = "metal+tensorops"

# zig configures its libc++ headers unlike Apple's libc++ on two counts,
# both put back here. Availability markup: with it, a library feature newer
# than the deployment target is an error at the line that uses it (`... is
# unavailable: introduced in macOS 26.0`), and headers that would call into
# a newer dylib (std::hash's __hash_memory, bad_function_call's key
# function) take the inline path a Mac build at that target takes.
# Visibility annotations: the standard library's types and exported
# functions keep default visibility under -fvisibility=hidden, as the RTTI
# of exceptions crossing into libmlx needs.
LIBCXX_FLAGS = ("-U_LIBCPP_HAS_VENDOR_AVAILABILITY_ANNOTATIONS", "-D_LIBCPP_HAS_VENDOR_AVAILABILITY_ANNOTATIONS=1",
                "-U_LIBCPP_DISABLE_VISIBILITY_ANNOTATIONS", "-U_LIBCXXABI_DISABLE_VISIBILITY_ANNOTATIONS")
# A macOS API newer than the deployment target (the SDK's headers mark each
# with its release) is a warning to Apple's clang and a crash on the older
# macOS when called; here it is an error.
AVAILABILITY_FLAGS = ("-Werror=unguarded-availability-new",)
# Where a Mac build links the C++ and Objective-C runtimes from.
LIBCXX_INSTALL_NAME = "/usr/lib/libc++.1.dylib"
LIBOBJC_INSTALL_NAME = "/usr/lib/libobjc.A.dylib"
# What a Python extension on macOS may leave to the interpreter: CPython's
# C API, whose symbols start with Py or _Py (C names take a leading _).
PYTHON_SYMBOL = re.compile(r"^__?Py")


class BuildError(RuntimeError):
    """The build could not run (as opposed to a unit that does not compile)."""


def _env(metal_toolchain: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CMAKE_ARGS")}
    env.update(ZIG_GLOBAL_CACHE_DIR=str(ZIG_CACHE), ZIG_LOCAL_CACHE_DIR=str(ZIG_CACHE), LC_ALL="C",
               MACOSX_DEPLOYMENT_TARGET=deployment_target())
    if metal_toolchain:
        env["PATH"] = f"{STUB_TOOLS}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(argv, cwd=None, env=None, timeout=900):
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env or _env(), capture_output=True, text=True,
                          timeout=timeout)


def deployment_target() -> str:
    """The macOS the Mac wheels are built for (cibuildwheel's
    MACOSX_DEPLOYMENT_TARGET, which cmake/metal.cmake gives the build)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    value = str(config["tool"]["cibuildwheel"]["macos"]["environment"]["MACOSX_DEPLOYMENT_TARGET"])
    if not re.fullmatch(r"\d+(\.\d+)?", value):
        raise BuildError(f"pyproject.toml: MACOSX_DEPLOYMENT_TARGET = {value!r} is not a macOS version")
    return value if "." in value else value + ".0"


def zig_target() -> str:
    return f"aarch64-macos.{deployment_target()}"


@dataclass(frozen=True)
class Tools:
    zig: str
    zig_version: str
    cmake: str
    cmake_version: str
    generator: str
    make_program: str

    def describe(self) -> str:
        return f"zig {self.zig_version} for {zig_target()}, cmake {self.cmake_version} ({self.generator})"


@lru_cache(maxsize=None)
def tools() -> Tools | str:
    """The tools of the build, or why they are missing."""
    spec = importlib.util.find_spec("ziglang")
    zig = None
    if spec is not None and spec.submodule_search_locations:
        pkg = Path(next(iter(spec.submodule_search_locations)))
        zig = next((p for p in (pkg / "zig", pkg / "zig.exe") if p.is_file()), None)
    if zig is None:
        return 'zig is not installed: install the test extra (pip install -e ".[test]", the ziglang wheel)'
    out = _run([zig, "version"])
    zig_version = out.stdout.strip()
    if out.returncode != 0 or not re.fullmatch(r"\d+\.\d+\.\d+\S*", zig_version):
        return f"`{zig} version` exited {out.returncode} without a version: {(out.stderr or out.stdout).strip()[-300:]}"
    cmake = shutil.which("cmake")
    out = _run([cmake, "--version"]) if cmake else None
    # (a cmake that fails is none: its output is no version)
    found = re.search(r"version (\d+)\.(\d+)\.(\d+)", out.stdout) if out and out.returncode == 0 else None
    if not found or tuple(map(int, found.groups()[:2])) < MINIMUM_CMAKE:
        return (f'cmake >= {".".join(map(str, MINIMUM_CMAKE))} is not on PATH: install the test extra '
                '(pip install -e ".[test]")')
    ninja, make = shutil.which("ninja"), shutil.which("make")
    if ninja:
        generator, program = "Ninja", ninja
    elif make:
        generator, program = "Unix Makefiles", make
    else:
        return 'neither ninja nor make is on PATH (CMake needs one to configure): install the test extra'
    return Tools(str(zig), zig_version, cmake, ".".join(found.groups()), generator, program)


def unavailable() -> str | None:
    """Why the build cannot run here (no tools, or no macOS wheel of MLX and
    no network to fetch it), else None."""
    if sys.platform == "darwin":
        return "a Mac builds the extension itself (pip install -e .); this build stands in for it elsewhere"
    t = tools()
    if isinstance(t, str):
        return t
    if mlx_metal_wheel.root() is None:
        return mlx_metal_wheel.reason()
    return None


def key_dir(t: Tools) -> Path:
    """Build folders of one toolchain: zig, the MLX release, Python's
    headers and the deployment target."""
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    return BUILD / f"zig{t.zig_version}-mlx{mlx_metal_wheel.release()}-py{py}-macos{deployment_target()}"


def _write(path: Path, text: str, mode: int | None = None) -> None:
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if mode is not None:
        path.chmod(mode)


def _toolchain(t: Tools) -> tuple[Path, Path]:
    """The compiler CMake is given (zig's clang and linker for the target)
    and the toolchain file."""
    kdir = key_dir(t)
    cxx = kdir / "c++"
    _write(cxx, "#!/bin/sh\n# zig's clang and Mach-O linker, for macOS arm64 at the Mac wheels' deployment target.\n"
                f'exec {shlex.quote(t.zig)} c++ -target {zig_target()} "$@"\n', 0o755)
    toolchain = kdir / "toolchain.cmake"
    _write(toolchain, f"""# macOS arm64, built on this machine by tests/macbuild/mac_build.py.
set(CMAKE_SYSTEM_NAME Darwin)
set(CMAKE_SYSTEM_PROCESSOR arm64)
set(CMAKE_OSX_DEPLOYMENT_TARGET "{deployment_target()}" CACHE STRING "")
set(CMAKE_CXX_COMPILER "{cxx}")
# zig's headers and libraries for the target, never an SDK found on the host.
set(CMAKE_OSX_SYSROOT "" CACHE PATH "")
# Configure checks compile without linking: a link would make zig build
# its C++ runtime in debug mode, with a sanitizer runtime no unit needs.
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
""")
    return cxx, toolchain


@dataclass(frozen=True)
class Command:
    """One compile of the configured build."""

    target: str
    source: Path
    output: Path  # absolute
    directory: Path
    argv: tuple[str, ...]

    @property
    def name(self) -> str:
        try:
            return str(self.source.relative_to(ROOT))
        except ValueError:
            return self.source.name

    def definitions(self) -> dict[str, str]:
        out = {}
        for i, a in enumerate(self.argv):
            d = a[2:] if a.startswith("-D") and len(a) > 2 else self.argv[i + 1] if a == "-D" else None
            if d is not None:
                name, _, value = d.partition("=")
                out[name] = value
        return out


@dataclass
class Configured:
    name: str
    dir: Path
    cxx: Path
    commands: list[Command]
    targets: dict[str, dict]  # File API target objects by name

    def command(self, source: str | Path) -> Command:
        source = Path(source) if Path(source).is_absolute() else ROOT / source
        found = [c for c in self.commands if c.source == source]
        if len(found) != 1:
            raise KeyError(f"{source} is compiled {len(found)} times in the {self.name} build")
        return found[0]

    def of_target(self, name: str) -> list[Command]:
        return [c for c in self.commands if c.target == name]


def _file_api(bdir: Path) -> dict[str, dict]:
    reply = bdir / ".cmake" / "api" / "v1" / "reply"
    index = json.loads(max(reply.glob("index-*.json")).read_text())
    model = json.loads((reply / index["reply"]["codemodel-v2"]["jsonFile"]).read_text())
    targets = {}
    for t in model["configurations"][0]["targets"]:
        data = json.loads((reply / t["jsonFile"]).read_text())
        targets[data["name"]] = data
    return targets


def configure(name: str, t: Tools) -> Configured:
    """The project's CMake configure of one Mac build."""
    config = CONFIGURATIONS[name]
    cxx, toolchain = _toolchain(t)
    bdir = key_dir(t) / name
    query = bdir / ".cmake" / "api" / "v1" / "query" / "codemodel-v2"
    query.parent.mkdir(parents=True, exist_ok=True)
    query.touch()
    argv = [t.cmake, "-S", ROOT, "-B", bdir, "-G", t.generator, f"-DCMAKE_MAKE_PROGRAM={t.make_program}",
            f"-DCMAKE_TOOLCHAIN_FILE={toolchain}",
            # Each source its own translation unit, as it is written: no
            # unity batches, no precompiled header (both lend a unit
            # includes it does not have; see units_alone.cmake).
            f"-DCMAKE_PROJECT_INCLUDE={HERE / 'units_alone.cmake'}", "-DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON",
            "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", "-DCMAKE_BUILD_TYPE=Release",
            # The framework C types no wheel ships (include/), libc++ as
            # Apple configures it, newer macOS APIs as errors. Given at every
            # configure: the cache keeps no older value.
            f"-DCMAKE_CXX_FLAGS={shlex.join(['-isystem', str(STANDIN), *LIBCXX_FLAGS, *AVAILABILITY_FLAGS])}",
            # MLX of the macOS wheel: Metal on, its headers and libmlx.dylib.
            f"-DMLX_DIR={mlx_metal_wheel.cmake_dir()}", f"-DPython_EXECUTABLE={sys.executable}",
            *config["options"]]
    out = _run(argv, env=_env(config["metal_toolchain"]))
    if out.returncode != 0:
        raise BuildError(f"CMake could not configure the {name} Mac build:\n{(out.stdout + out.stderr)[-6000:]}")
    commands = []
    for entry in json.loads((bdir / "compile_commands.json").read_text()):
        directory = Path(entry["directory"])
        argv_ = tuple(entry["arguments"]) if "arguments" in entry else tuple(shlex.split(entry["command"]))
        output = Path(os.path.normpath(directory / entry["output"]))
        rel = output.relative_to(bdir).parts
        target = rel[1][: -len(".dir")] if len(rel) > 2 and rel[0] == "CMakeFiles" else ""
        commands.append(Command(target, Path(entry["file"]), output, directory, argv_))
    return Configured(name, bdir, cxx, commands, _file_api(bdir))


@dataclass
class Unit:
    """One unit of one build: compiled there, or the object of the full
    build reused (the command differs only in definitions that no file the
    unit reads names)."""

    config: str
    command: Command
    ok: bool
    output: str
    object: Path
    deps: list[str] = field(default_factory=list)
    reused: bool = False
    cached: bool = False
    seconds: float = 0.0


def _parse_deps(text: str) -> list[str]:
    body = text.replace("\\\n", " ").partition(":")[2]
    return [t.replace("\\ ", " ") for t in re.findall(r"(?:\\ |\S)+", body)]


_hashes: dict[tuple[str, int, int], str] = {}


def _file_hash(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _hashes:
        _hashes[key] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return _hashes[key]


def _digest(argv: tuple[str, ...], deps: list[str]) -> str | None:
    """The command, the compiler (zig's version and its executable's
    contents) and every file the unit read."""
    t = tools()
    h = hashlib.sha256("\0".join([t.zig_version, _file_hash(t.zig) or "", *argv]).encode())
    for d in deps:
        fh = _file_hash(d)
        if fh is None:
            return None
        h.update(f"\0{d}\0{fh}".encode())
    return h.hexdigest()


def compile_unit(cmd: Command, config: str, cache: bool = True) -> Unit:
    """Compiles one unit, or takes its object from the cache: objects
    under build/mac-build/objects, each with the digest of its command,
    the compiler and the contents of every file the compiler read (its
    dependency list), reused while none of them changed."""
    key = hashlib.sha256("\0".join([str(cmd.directory), *cmd.argv]).encode()).hexdigest()[:32]
    cached_obj, entry = OBJECTS / f"{key}.o", OBJECTS / f"{key}.json"
    if cache and entry.exists() and cached_obj.exists():
        saved = json.loads(entry.read_text())
        if _digest(cmd.argv, saved["deps"]) == saved["digest"]:
            return Unit(config, cmd, True, "", cached_obj, saved["deps"], cached=True)
    depfile = cmd.output.with_suffix(cmd.output.suffix + ".deps")
    cmd.output.parent.mkdir(parents=True, exist_ok=True)
    cmd.output.unlink(missing_ok=True)
    start = time.monotonic()
    out = _run([*cmd.argv, "-MD", "-MF", depfile], cwd=cmd.directory)
    ok = out.returncode == 0 and cmd.output.exists()
    deps = _parse_deps(depfile.read_text()) if ok and depfile.exists() else []
    unit = Unit(config, cmd, ok, out.stdout + out.stderr, cmd.output, deps, seconds=time.monotonic() - start)
    digest = _digest(cmd.argv, deps) if ok and cache else None
    if digest is not None:
        OBJECTS.mkdir(parents=True, exist_ok=True)
        tmp = OBJECTS / f"{key}.{os.getpid()}.tmp"
        shutil.move(cmd.output, tmp)
        tmp.replace(cached_obj)
        entry.write_text(json.dumps({"source": str(cmd.source), "deps": deps, "digest": digest}))
        unit.object = cached_obj
    return unit


_mentions: dict[tuple[str, tuple[str, ...]], bool] = {}


def _mentions_any(path: str, names: tuple[str, ...]) -> bool:
    key = (path, names)
    if key not in _mentions:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            text = "".join(names)  # unreadable: assume it matters
        _mentions[key] = bool(re.search(r"\b(" + "|".join(map(re.escape, names)) + r")\b", text))
    return _mentions[key]


def _reusable(cmd: Command, base: Unit | None) -> bool:
    """Whether the full build's object of this unit is this build's too."""
    if base is None or not base.ok or not base.deps:
        return False
    a, b = set(cmd.argv), set(base.command.argv)
    differ = a ^ b
    if not all(x.startswith("-D") and len(x) > 2 for x in differ):
        return False
    names = tuple(sorted({x[2:].partition("=")[0] for x in differ}))
    return not names or not any(_mentions_any(d, names) for d in base.deps)


def compile_all(conf: Configured, base: dict[tuple[str, Path], Unit] | None = None) -> dict[tuple[str, Path], Unit]:
    """Every unit of a build, as many at once as there are cores."""
    todo, units = [], {}
    for cmd in conf.commands:
        prior = (base or {}).get((cmd.target, cmd.source))
        if _reusable(cmd, prior):
            units[(cmd.target, cmd.source)] = Unit(conf.name, cmd, True, "", prior.object, prior.deps, reused=True)
        else:
            todo.append(cmd)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for unit in pool.map(lambda c: compile_unit(c, conf.name), todo):
            units[(unit.command.target, unit.command.source)] = unit
    return units


# ---------------------------------------------------------------------------
# Link stand-ins: the system libraries a Mac build links and no wheel ships.


def _zig_libcxx(conf: Configured) -> list[Path]:
    """zig's libc++ and libc++abi for the target (zig builds them on first
    use): a C++ program is linked and zig's verbose link line names them."""
    probe = conf.dir.parent / "libcxx-probe"
    probe.mkdir(parents=True, exist_ok=True)
    (probe / "probe.cpp").write_text(
        "#include <string>\nint main(int n, char**) { return (int)std::to_string(n).size(); }\n")
    out = _run([conf.cxx, "-O2", "-v", "probe.cpp", "-o", "probe"], cwd=probe)
    found = sorted({Path(t) for t in out.stderr.split() if t.endswith(("/libc++.a", "/libc++abi.a"))})
    if out.returncode != 0 or len(found) != 2:
        raise BuildError(f"could not find zig's libc++ for {zig_target()}:\n{(out.stdout + out.stderr)[-3000:]}")
    return found


def _libcxx_abi_tag(conf: Configured) -> str:
    """The ABI tag libc++ gives what it keeps out of its ABI
    (_LIBCPP_HIDE_FROM_ABI: inline, hidden, never exported by the dylib),
    as it appears in mangled names: B<length><signature>."""
    probe = conf.dir.parent / "libcxx-probe"
    probe.mkdir(parents=True, exist_ok=True)
    (probe / "tag.cpp").write_text("#include <cstddef>\nLIBCXX_TAG _LIBCPP_TOSTRING(_LIBCPP_ODR_SIGNATURE)\n")
    out = _run([conf.cxx, *LIBCXX_FLAGS, "-E", "tag.cpp"], cwd=probe)
    m = re.search(r'^LIBCXX_TAG "(\w+)"$', out.stdout, re.M)
    if out.returncode != 0 or not m:
        raise BuildError(f"could not read libc++'s ABI tag:\n{(out.stdout + out.stderr)[-3000:]}")
    return f"B{len(m.group(1))}{m.group(1)}"


def stand_ins(conf: Configured) -> dict[str, Path]:
    """The .tbd stubs the link takes for what no wheel ships, by install
    name (frameworks under stubs/frameworks/<Name>.framework/):

    - libc++ (/usr/lib/libc++.1.dylib): every external symbol that zig's
      libc++ and libc++abi, built for the target from the headers the units
      compile with, define, but those libc++ keeps out of its ABI (zig's
      static build defines those too; a dylib never exports them, and each
      unit keeps its own hidden copy). Each link takes them less what its
      own objects define (see link()). The bundle then imports libc++ from the
      system's dylib as a Mac build does, instead of embedding a copy; a
      symbol no libc++ defines fails the link, and one the system's dylib
      gained after the deployment target is kept out by the availability
      markup (LIBCXX_FLAGS) at compile time.
    - libobjc and the frameworks MLX's CMake package links (Metal,
      Foundation, QuartzCore, Accelerate): exactly the symbols libmlx.dylib,
      which Apple's linker linked against the SDK, imports from each, under
      the install names it records.
    """
    sdir = conf.dir.parent / "stubs"
    done = sdir / ".done"
    mlx = macho.read(mlx_metal_wheel.libmlx())
    imports: dict[str, set[str]] = {}
    for sym, lib in mlx.imports().items():
        if lib is not None:
            imports.setdefault(lib, set()).add(sym)
    out: dict[str, Path] = {LIBCXX_INSTALL_NAME: sdir / "libc++.tbd", LIBOBJC_INSTALL_NAME: sdir / "libobjc.tbd"}
    for lib in mlx.dylibs:
        m = re.search(r"/([^/]+)\.framework/", lib)
        if m:
            out[lib] = sdir / "frameworks" / f"{m.group(1)}.framework" / f"{m.group(1)}.tbd"
    wanted = [*out.values(), out[LIBCXX_INSTALL_NAME].with_suffix(".json")]
    if done.exists() and all(p.exists() for p in wanted):
        return out
    sdir.mkdir(parents=True, exist_ok=True)
    libcxx: set[str] = set()
    for archive in _zig_libcxx(conf):
        libcxx |= macho.archive_definitions(archive)
    tag = _libcxx_abi_tag(conf)
    libcxx = {s for s in libcxx if tag not in s}
    out[LIBCXX_INSTALL_NAME].with_suffix(".json").write_text(json.dumps(sorted(libcxx)))
    macho.write_tbd(out[LIBCXX_INSTALL_NAME], LIBCXX_INSTALL_NAME, libcxx)
    for lib, path in out.items():
        if lib != LIBCXX_INSTALL_NAME:
            path.parent.mkdir(parents=True, exist_ok=True)
            macho.write_tbd(path, lib, imports.get(lib, set()))
    done.write_text("\n".join(sorted(out)) + "\n")
    return out


# ---------------------------------------------------------------------------
# The link.


@dataclass
class Linked:
    config: str
    ok: bool
    output: str
    path: Path
    argv: list[str]
    python_symbols: set[str]  # what the build's link leaves to the interpreter (ld64 -U)
    image: macho.Image | None = None
    problems: list[str] = field(default_factory=list)


def _python_symbols(response_file: Path) -> set[str]:
    """The `-U <symbol>` lines of the link's response file (nanobind's list
    of CPython's API); anything else in it is not understood here."""
    names = set()
    for line in response_file.read_text().split("\n"):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or parts[0] != "-U":
            raise BuildError(f"{response_file}: the check reads only '-U <symbol>' lines, not {line!r}")
        names.add(parts[1])
    return names


def _archive(t: Tools, path: Path, members: list[Path]) -> None:
    path.unlink(missing_ok=True)
    out = _run([t.zig, "ar", "--format=darwin", "rcs", path, *members])
    if out.returncode != 0:
        raise BuildError(f"zig ar could not make {path}:\n{out.stderr}")


def link(conf: Configured, units: dict[tuple[str, Path], Unit], t: Tools, objects: list[Path] | None = None,
         output: Path | None = None) -> Linked:
    """The extension linked as the build's link line says, with what zig's
    linker does differently (each line of the translation says why).
    `objects` replaces the module's own objects (the self-tests)."""
    target = conf.targets[MODULE]
    by_output = {u.command.output: u.object for u in units.values()}
    if objects is None:
        objects = [by_output[c.output] for c in conf.of_target(MODULE)]
        # Object libraries' objects ($<TARGET_OBJECTS:...>: the NEON kernels).
        for s in target["sources"]:
            # File API paths are relative to the source folder.
            path = Path(os.path.normpath(ROOT / s["path"]))
            if path.suffix == ".o":
                objects.append(by_output[path])
    stubs = stand_ins(conf)
    args: list[str] = []
    archives: list[Path] = []
    python: set[str] = set()
    deps = {d["id"].split("::")[0] for d in target.get("dependencies", [])}
    static = {conf.targets[d]["artifacts"][0]["path"]: d for d in deps
              if conf.targets[d]["type"] == "STATIC_LIBRARY"}
    for frag in target["link"]["commandFragments"]:
        parts = shlex.split(frag["fragment"])
        i = 0
        while i < len(parts):
            p = parts[i]
            if p == "-bundle":
                # zig's linker writes no MH_BUNDLE; a dylib resolves every
                # symbol by the same rules and differs in its file type.
                args.append("-shared")
            elif p.startswith("-Wl,@"):
                # The response file (nanobind's) lists `-U <symbol>` for
                # CPython's API: those may stay undefined, all others are
                # errors. zig's linker reads no response file and no -U, so
                # everything undefined is left to the load-time lookup and
                # checked against the list afterwards (check_image).
                python |= _python_symbols(Path(p[len("-Wl,@"):]))
                args.append("-Wl,-undefined,dynamic_lookup")
            elif p.startswith("-F"):
                pass  # Xcode's frameworks: the stand-ins' folder instead (below)
            elif p == "-framework":
                args += ["-framework", parts[i + 1]]
                i += 1
            elif p in static:
                lib = conf.dir / p
                _archive(t, lib, [by_output[c.output] for c in conf.of_target(static[p])])
                archives.append(lib)
                args.append(str(lib))
            else:
                args.append(p)
            i += 1
    output = output or conf.dir / target["nameOnDisk"]
    output.unlink(missing_ok=True)
    # libc++ less what the link's own objects define. ld64 binds a symbol
    # that an object defines (a weak copy of an inline function, a vtable
    # emitted for want of a key function) to that definition; zig's linker
    # binds it to a dylib that exports it too, which would import from the
    # system's libc++ what a Mac build never imports from it.
    local: set[str] = set()
    for obj in objects:
        local |= macho.read(obj).definitions()
    for lib in archives:
        for member, body in macho.archive_members(lib):
            local |= macho.parse(body, member).definitions()
    exports = set(json.loads(stubs[LIBCXX_INSTALL_NAME].with_suffix(".json").read_text()))
    libcxx = output.with_name(output.name + ".libc++.tbd")
    macho.write_tbd(libcxx, LIBCXX_INSTALL_NAME, exports - local)
    # libc++ and libobjc from their stand-ins (a Mac build reaches libobjc
    # through Foundation, which re-exports it), frameworks from theirs.
    args += ["-nostdlib++", str(libcxx), str(stubs[LIBOBJC_INSTALL_NAME]),
             f"-F{stubs[LIBCXX_INSTALL_NAME].parent / 'frameworks'}"]
    argv = [str(conf.cxx), *map(str, objects), *args, "-o", str(output)]
    out = _run(argv, cwd=conf.dir)
    linked = Linked(conf.name, out.returncode == 0 and output.exists(), out.stdout + out.stderr, output, argv, python)
    if linked.ok:
        linked.image = macho.read(output)
        linked.problems = check_image(linked, objects)
    return linked


def check_image(linked: Linked, objects: list[Path]) -> list[str]:
    """What a Mac build's link would reject, or a Mac would not load."""
    img, problems = linked.image, []
    if img.cputype != macho.CPU_TYPE_ARM64:
        problems.append(f"not an arm64 image (cputype {img.cputype:#x})")
    if img.filetype != "dylib":
        problems.append(f"a {img.filetype}, not a loadable module")
    if img.platform != macho.PLATFORM_MACOS or img.min_os != deployment_target():
        problems.append(f"built for platform {img.platform}, macOS {img.min_os}; expected macOS {deployment_target()}")
    flat = sorted(s for s, lib in img.imports().items() if lib is None)
    stray = [s for s in flat if s not in linked.python_symbols or not PYTHON_SYMBOL.match(s)]
    if stray:
        users: dict[str, list[str]] = {}
        for obj in objects:
            try:
                undefined = {s.name for s in macho.read(obj).symbols if s.undefined}
            except (OSError, ValueError):
                continue
            for s in stray:
                if s in undefined:
                    users.setdefault(s, []).append(Path(obj).name)
        lines = [f"  {s}  (referenced by {', '.join(users.get(s, ['?'])[:4])})" for s in stray[:40]]
        problems.append(f"{len(stray)} undefined symbol(s) that neither libmlx, libc++, libobjc, the frameworks "
                        "nor libSystem define and that are not Python's (a Mac build's link fails on each):\n"
                        + "\n".join(lines))
    if "@rpath/libmlx.dylib" not in img.dylibs:
        problems.append(f"libmlx.dylib is not loaded through @rpath (libraries: {img.dylibs})")
    if "@loader_path/../mlx/lib" not in img.rpaths:
        problems.append(f"no rpath to the mlx wheel's lib folder (rpaths: {img.rpaths})")
    return problems


# ---------------------------------------------------------------------------
# Self-tests: snippets compiled with a unit's command, with and without a
# mistake (-DMACBUILD_BAD=<n>), and linked as the extension is.

SNIPPET_UNIT = "src/metal/program.cpp"
SELFTEST_CACHE = BUILD / "selftest"


@dataclass
class Snippet:
    ok: bool
    output: str
    object: Path | None
    deps: list[str]


def compile_snippet(conf: Configured, source: Path, variant: int, deps: list[str] | None = None) -> Snippet:
    """`source` compiled with SNIPPET_UNIT's command in `conf`, with mistake
    `variant` in (0: as written). Results, failures included, are kept with
    the digest of the command and of the files the as-written snippet reads
    (`deps`; its own for variant 0)."""
    with _locked():
        return _compile_snippet(conf, source, variant, deps)


def _compile_snippet(conf: Configured, source: Path, variant: int, deps: list[str] | None) -> Snippet:
    cmd = conf.command(SNIPPET_UNIT)
    argv = list(cmd.argv)
    key = hashlib.sha256("\0".join([*argv, str(source), str(variant)]).encode()).hexdigest()[:32]
    obj, entry = SELFTEST_CACHE / f"{key}.o", SELFTEST_CACHE / f"{key}.json"
    argv[argv.index("-o") + 1] = str(obj)
    argv[argv.index("-c") + 1] = str(source)
    argv.append(f"-DMACBUILD_BAD={variant}")
    if entry.exists():
        saved = json.loads(entry.read_text())
        if _digest(tuple(argv), saved["deps"]) == saved["digest"] and (not saved["ok"] or obj.exists()):
            return Snippet(saved["ok"], saved["output"], obj if saved["ok"] else None, saved["deps"])
    SELFTEST_CACHE.mkdir(parents=True, exist_ok=True)
    obj.unlink(missing_ok=True)
    depfile = obj.with_suffix(".deps")
    out = _run([*argv, "-MD", "-MF", depfile], cwd=cmd.directory)
    ok = out.returncode == 0 and obj.exists()
    if deps is None:
        deps = _parse_deps(depfile.read_text()) if ok and depfile.exists() else []
    digest = _digest(tuple(argv), deps) if deps else None
    output = out.stdout + out.stderr
    if digest is not None:
        entry.write_text(json.dumps({"ok": ok, "output": output, "deps": deps, "digest": digest}))
    return Snippet(ok, output, obj if ok else None, deps)


def link_snippet(report: "Report", source: Path, variant: int, config: str = FULL) -> Linked:
    """`source` linked alone as the extension is linked (its link line,
    stand-ins and checks)."""
    conf = report.configs[config]
    written = compile_snippet(conf, source, 0)
    snippet = written if variant == 0 else compile_snippet(conf, source, variant, written.deps)
    if not snippet.ok:
        raise BuildError(f"{source.name} (mistake {variant}) does not compile:\n{snippet.output[-3000:]}")
    out = SELFTEST_CACHE / f"{source.stem}-{variant}.dylib"
    with _locked():
        return link(conf, report.units[config], report.tools, objects=[snippet.object], output=out)


# ---------------------------------------------------------------------------
# Everything, with a lock: other runs in this checkout share build/.


@contextmanager
def _locked():
    """One build at a time in build/mac-build (other test runs in this
    checkout share it)."""
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@dataclass
class Report:
    tools: Tools
    configs: dict[str, Configured]
    units: dict[str, dict[tuple[str, Path], Unit]]
    links: dict[str, Linked]
    seconds: float


def build_all() -> Report:
    t = tools()
    if isinstance(t, str):
        raise BuildError(t)
    if mlx_metal_wheel.root() is None:
        raise BuildError(mlx_metal_wheel.reason())
    start = time.monotonic()
    with _locked():
        configs, units, links = {}, {}, {}
        for name in CONFIGURATIONS:
            configs[name] = configure(name, t)
            units[name] = compile_all(configs[name], units.get(FULL))
            if all(u.ok for u in units[name].values()):
                links[name] = link(configs[name], units[name], t)
    return Report(t, configs, units, links, time.monotonic() - start)


def first_errors(output: str, n: int = 12) -> str:
    lines = [ln for ln in output.splitlines() if "unable to open library directory" not in ln]
    idx = next((i for i, ln in enumerate(lines) if "error:" in ln), 0)
    return "\n".join(lines[idx: idx + n])


if __name__ == "__main__":
    why = unavailable()
    if why:
        sys.exit(why)
    report = build_all()
    print(f"{report.tools.describe()}: {report.seconds:.1f} s")
    failed = False
    for name, units in report.units.items():
        bad = [u for u in units.values() if not u.ok]
        own = sum(not u.reused for u in units.values())
        cached = sum(u.cached for u in units.values())
        print(f"[{name}] {len(units)} units ({own} of this build, {cached} of them cached; the others the "
              f"{FULL} build's): "
              f"{'ok' if not bad else f'{len(bad)} FAILED'}")
        for u in bad:
            failed = True
            print(f"  {u.command.name}:\n{first_errors(u.output, 30)}")
        if name in report.links:
            ln = report.links[name]
            status = "ok" if ln.ok and not ln.problems else "FAILED"
            print(f"[{name}] link: {status}  {ln.path}")
            if not ln.ok:
                failed = True
                print(ln.output[-4000:])
            for p in ln.problems:
                failed = True
                print("  " + p)
    sys.exit(1 if failed else 0)
