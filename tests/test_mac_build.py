"""The extension built for macOS arm64 on Linux: compiled and linked as a
Mac build does it, judged by Apple's metal-cpp, macOS's C library and libc++
headers, and linked against MLX's real libmlx.dylib.

tests/macbuild/mac_build.py runs the project's CMake configure for the
target (every unit, definition and flag comes from CMakeLists.txt), compiles
each unit with zig's clang for arm64-apple-macos<deployment target> against
MLX's macOS wheel (`mlx-metal`, with Apple's metal-cpp), and links the
extension against the wheel's libmlx.dylib, libc++, libobjc and libSystem,
leaving only CPython's API to the interpreter. Self-tests show each kind of
Mac-only mistake failing the check, at its line. Without the wheel (no
network, nothing cached) the tests skip and say why;
MLX_LATTICE_REQUIRE_MAC_BUILD=1 (.ci/run) turns that into a failure.
"""

import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "macbuild"))
import mac_build as mb  # noqa: E402
import macho  # noqa: E402

CONFIGS = list(mb.CONFIGURATIONS)


def _available():
    why = mb.unavailable()
    if why:
        if os.environ.get("MLX_LATTICE_REQUIRE_MAC_BUILD") == "1":
            pytest.fail(f"MLX_LATTICE_REQUIRE_MAC_BUILD=1 but the macOS build cannot run: {why}")
        pytest.skip(f"the macOS build cannot run here: {why}")


@pytest.fixture(scope="module")
def report():
    _available()
    return mb.build_all()


def _defs(report, config, source):
    return report.configs[config].command(source).definitions()


def test_reads_the_build(report):
    # What the configure gives each Mac build, read back: an edit of
    # CMakeLists.txt that the check stops seeing must fail here.
    full = report.configs[mb.FULL]
    assert mb.deployment_target() == "14.0"
    for conf in report.configs.values():
        assert all(f"-mmacosx-version-min={mb.deployment_target()}" in c.argv for c in conf.commands)
    # Every .cpp under src/ is a unit of the module or of a CPU kernel path.
    units = {c.source for c in full.commands}
    assert set((mb.ROOT / "src").rglob("*.cpp")) <= units
    # The arm64 kernel path, NEON (src/cpu/isa_begin.h: id 3), with the
    # extension; nanobind's library; the generated key source. Every unit
    # compiled reaches the link: the module's own, an object library's
    # objects among its sources, or a static library it depends on.
    targets = {c.target for c in full.commands}
    assert {mb.MODULE, "lattice_cpu_neon", "nanobind-static"} <= targets
    module = full.targets[mb.MODULE]
    deps = {d["id"].split("::")[0] for d in module.get("dependencies", [])}
    linked_objects = {os.path.normpath(mb.ROOT / s["path"]) for s in module["sources"] if s["path"].endswith(".o")}
    for c in full.commands:
        kind = full.targets[c.target]["type"]
        assert c.target == mb.MODULE or (kind == "OBJECT_LIBRARY" and str(c.output) in linked_objects) or (
            kind == "STATIC_LIBRARY" and c.target in deps), f"{c.name} ({c.target}) is compiled but not linked"
    assert all(c.definitions().get("LATTICE_ISA_ID") == "3" for c in full.of_target("lattice_cpu_neon"))
    assert any(c.source.name == "lattice_keys_source.cpp" for c in full.of_target(mb.MODULE))
    # The Metal definitions of each build, and MLX's macOS flags.
    metal = {"MLX_LATTICE_METAL": "1", "MLX_LATTICE_TENSOROPS": "1"}
    expected = {"metal+tensorops": metal, "metal": {"MLX_LATTICE_METAL": "1"}, "cpu": {}}
    for config, defs in expected.items():
        got = _defs(report, config, "src/metal/program.cpp")
        assert {k: v for k, v in got.items() if k.startswith("MLX_LATTICE_")} == defs, config
        assert {"_METAL_", "ACCELERATE_NEW_LAPACK", "NB_DOMAIN"} <= set(got)
    # Apple's metal-cpp and MLX's headers from the macOS wheel, the C types
    # no wheel ships from the stand-in, nothing else of the Mac's.
    program = report.units[mb.FULL][(mb.MODULE, mb.ROOT / "src/metal/program.cpp")]
    wheel = str(mb.mlx_metal_wheel.include_dir())
    assert any(d.startswith(wheel + "/metal_cpp/Metal/") for d in program.deps)
    assert any(d.startswith(wheel + "/mlx/backend/metal/") for d in program.deps)
    standin = sorted(str(Path(d).relative_to(mb.STANDIN)) for d in program.deps if d.startswith(str(mb.STANDIN)))
    assert standin == ["CoreFoundation/CoreFoundation.h", "IOSurface/IOSurfaceRef.h"]
    # The module's link: nanobind's list of CPython's API, MLX's frameworks.
    link = " ".join(f["fragment"] for f in full.targets[mb.MODULE]["link"]["commandFragments"])
    assert "darwin-ld-cpython.sym" in link and "-framework Metal" in link and "libmlx.dylib" in link


@pytest.mark.parametrize("config", CONFIGS)
def test_every_unit_compiles(report, config):
    bad = [u for u in report.units[config].values() if not u.ok]
    assert not bad, f"{len(bad)} unit(s) of the {config} Mac build do not compile ({report.tools.describe()}):\n" + \
        "\n".join(f"--- {u.command.name}\n{mb.first_errors(u.output, 25)}" for u in bad)


def test_only_the_definitions_change_between_builds(report):
    # The metal and cpu builds compile again the units whose text names a
    # definition they lack (and the key source, generated in each build's
    # folder); every other object is the full build's. The oracle: grep.
    full = {k: v for k, v in _defs(report, mb.FULL, "src/metal/program.cpp").items()}
    headers = [*(mb.ROOT / "src").rglob("*.h"), *(mb.ROOT / "metal").glob("*.h")]
    for config in ("metal", "cpu"):
        gone = [d for d in full if d not in _defs(report, config, "src/metal/program.cpp")]
        assert gone
        named = re.compile(r"\b(" + "|".join(gone) + r")\b")
        assert not any(named.search(h.read_text()) for h in headers), "a header names them: every unit differs"
        expected = {str(p.relative_to(mb.ROOT)) for p in (mb.ROOT / "src").rglob("*.cpp")
                    if named.search(p.read_text())}
        own = {u.command.name for u in report.units[config].values() if not u.reused}
        generated = {n for n in own if n.startswith("build/")}
        assert own - generated == expected, config
        assert {Path(n).name for n in generated} == {"lattice_keys_source.cpp"}


@pytest.mark.parametrize("config", CONFIGS)
def test_links(report, config):
    assert config in report.links, f"the {config} build was not linked: a unit does not compile"
    linked = report.links[config]
    assert linked.ok, f"the {config} Mac build does not link:\n{linked.output[-6000:]}"
    assert not linked.problems, f"the {config} Mac build's extension:\n" + "\n".join(linked.problems)
    img = linked.image
    libs = set(img.dylibs)
    assert {"@rpath/libmlx.dylib", mb.LIBCXX_INSTALL_NAME, "/usr/lib/libSystem.B.dylib"} <= libs
    imports = img.imports()
    # Python's API, and only it, is left to the interpreter; the C++ runtime
    # comes from the system's libc++, MLX from libmlx.dylib.
    flat = {s for s, lib in imports.items() if lib is None}
    assert flat and all(mb.PYTHON_SYMBOL.match(s) for s in flat)
    assert "_PyLong_FromLong" in flat or any(s.startswith("_PyLong_") for s in flat)
    by_lib = {}
    for s, lib in imports.items():
        by_lib.setdefault(lib, set()).add(s)
    assert any(s.startswith("__ZN3mlx4core") for s in by_lib["@rpath/libmlx.dylib"])
    assert "___cxa_throw" in by_lib[mb.LIBCXX_INSTALL_NAME]
    # The NEON kernels are in (their namespace mlx_lattice::cpu::neon).
    assert any("N11mlx_lattice3cpu4neon" in s for s in (sym.name for sym in img.symbols))


def test_metal_host_code_calls_metal_through_objc(report):
    # The Metal builds' units send Objective-C messages (metal-cpp, bound to
    # libobjc) with MLX's selectors (bound to libmlx.dylib); the CPU-only
    # build's units do neither.
    def referenced(config):
        names = set()
        for u in report.units[config].values():
            names |= {s.name for s in macho.read(u.object).symbols if s.undefined}
        return names

    for config in ("metal+tensorops", "metal"):
        imports = report.links[config].image.imports()
        assert "_objc_msgSend" in referenced(config)
        assert imports["_objc_msgSend"] == mb.LIBOBJC_INSTALL_NAME
        selectors = {s for s in imports if s.startswith("__ZN3MTL7Private8Selector")}
        assert selectors and all(imports[s] == "@rpath/libmlx.dylib" for s in selectors)
    cpu = referenced("cpu")
    assert "_objc_msgSend" not in cpu and not any("MTL7Private" in s for s in cpu)


def test_libcxx_stand_in_names_what_macos_exports(report):
    # Every libc++ symbol libmlx.dylib (linked by Apple's linker against the
    # SDK) imports is exported by the stand-in under the same name: the
    # stand-in and the system's libc++ agree on names and ABI namespace.
    stubs = mb.stand_ins(report.configs[mb.FULL])
    exports = set(__import__("json").loads(stubs[mb.LIBCXX_INSTALL_NAME].with_suffix(".json").read_text()))
    mlx = macho.read(mb.mlx_metal_wheel.libmlx())
    from_libcxx = {s for s, lib in mlx.imports().items() if lib == mb.LIBCXX_INSTALL_NAME}
    assert len(from_libcxx) > 50
    assert from_libcxx <= exports, sorted(from_libcxx - exports)[:20]
    # Nothing libc++ keeps out of its ABI (inline, hidden) is offered.
    tag = mb._libcxx_abi_tag(report.configs[mb.FULL])
    assert re.fullmatch(r"B\d+\w+", tag)
    assert not any(tag in s for s in exports)


# ---------------------------------------------------------------------------
# Self-tests: each snippet compiles (and links) as written; with
# -DMACBUILD_BAD=<n> it holds mistake <n>, which must fail the check with
# its first error at the line marked MACBUILD-ERROR <n>.


def _cases(marker):
    cases = []
    for path in sorted(mb.SELFTEST.glob("*.cpp")):
        marks = {}
        for i, line in enumerate(path.read_text().splitlines(), 1):
            m = re.search(rf"{marker} (\d+)", line)
            if m:
                marks[int(m.group(1))] = i
        if marks:
            cases.append(pytest.param(path, 0, None, id=f"{path.stem}-as-written"))
            cases += [pytest.param(path, n, line, id=f"{path.stem}-mistake{n}") for n, line in sorted(marks.items())]
    return cases


@pytest.mark.parametrize("path, variant, line", _cases("MACBUILD-ERROR"))
def test_check_rejects_mistakes(report, path, variant, line):
    conf = report.configs[mb.FULL]
    written = mb.compile_snippet(conf, path, 0)
    if variant == 0:
        assert written.ok, written.output
        return
    res = mb.compile_snippet(conf, path, variant, written.deps)
    assert not res.ok, f"{path.name}: mistake {variant} compiled"
    errors = re.findall(r"^(.*?):(\d+):\d+: (?:fatal )?error:", res.output, re.M)
    assert errors, res.output
    where, at = errors[0]
    assert Path(where).name == path.name and int(at) == line, (
        f"{path.name}: first error at {where}:{at}, expected line {line}:\n{res.output}"
    )


@pytest.mark.parametrize("path, variant, line", _cases("MACBUILD-LINK"))
def test_check_rejects_unresolved_symbols(report, path, variant, line):
    linked = mb.link_snippet(report, path, variant)
    assert linked.ok, linked.output
    flat = {s for s, lib in linked.image.imports().items() if lib is None}
    assert "_PyLong_FromLong" in flat
    if variant == 0:
        assert not linked.problems, linked.problems
        return
    assert len(linked.problems) == 1 and "_lattice_selftest_nowhere" in linked.problems[0], linked.problems
    assert "_PyLong" not in linked.problems[0]


def test_stand_in_declares_only_what_metal_cpp_takes_from_the_frameworks(report):
    # The stand-in holds one typedef per framework type, each named by
    # Apple's metal-cpp from the wheel, through the header it includes.
    headers = {str(p.relative_to(mb.STANDIN)): p.read_text() for p in mb.STANDIN.rglob("*.h")}
    declared = {h: re.findall(r"^typedef [^;]*\b(\w+);$", text, re.M) for h, text in headers.items()}
    assert declared == {"CoreFoundation/CoreFoundation.h": ["CFTimeInterval"],
                        "IOSurface/IOSurfaceRef.h": ["IOSurfaceRef"]}
    metal_cpp = mb.mlx_metal_wheel.include_dir() / "metal_cpp"
    text = "\n".join(p.read_text() for p in metal_cpp.rglob("*.hpp"))
    for header, (name,) in declared.items():
        assert f"#include <{header}>" in text
        assert re.search(rf"\b{name}\b", text)


@pytest.mark.parametrize("broken", ["zig", "cmake"])
def test_a_tool_that_fails_its_version_probe_is_named_not_read(monkeypatch, broken):
    # Runs without the macOS build: the probes' answers are stood in for.
    real = mb._run

    def run(argv, **kw):
        name = Path(str(argv[0])).name
        if name == broken or (broken == "zig" and argv[1:] == ["version"]):
            return mb.subprocess.CompletedProcess(argv, 127, "", f"{name}: error while loading shared libraries")
        if name == "cmake":
            return mb.subprocess.CompletedProcess(argv, 0, "cmake version 3.25.1\n", "")
        return real(argv, **kw)

    if mb.importlib.util.find_spec("ziglang") is None:
        pytest.skip("the ziglang wheel (test extra) is not installed")
    monkeypatch.setattr(mb, "_run", run)
    monkeypatch.setattr(mb.shutil, "which", lambda name: f"/usr/bin/{name}")
    why = mb.tools.__wrapped__()  # (not through the cache the real build reads)
    assert isinstance(why, str)
    if broken == "zig":
        assert "version` exited 127 without a version" in why and "error while loading" in why
    else:
        assert why.startswith("cmake >= 3.25 is not on PATH")
