"""The Mac build's host C++ compiles, checked on Linux.

Code under MLX_LATTICE_METAL (the program encoder, the primitives' Metal
paths) is compiled only by a Mac build; a mistake there would first show as
a failed `pip install` on a Mac. tests/machost/check.py compiles every
translation unit of the extension with -fsyntax-only as a Mac build with
Metal does: the Metal compile definitions from CMakeLists.txt, MLX's macOS
flags, MLX's real Metal headers and a strict declarations-only stand-in for
Apple's metal-cpp (tests/machost/include). The self-tests show that the
stand-in and the check reject each kind of mistake: a snippet per kind
compiles as written and fails, at the marked line, with the mistake in.
"""

import os
import re
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "machost"))
import check  # noqa: E402

SELFTEST = Path(__file__).resolve().parent / "machost" / "selftest"
UNITS = check.sources()
PLAN = check.plan(UNITS)


def _compiler():
    found = check.find_compiler()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="module")
def results():
    """Every unit, compiled at once (as many at a time as there are cores)."""
    return check.check_all(UNITS, _compiler())


def test_reads_the_build():
    # The check's inputs come from the build files; an edit there that the
    # parsing no longer sees must fail here, not turn the check off.
    assert {"MLX_LATTICE_METAL=1", "MLX_LATTICE_TENSOROPS=1"} <= set(check.metal_definitions())
    assert check.cxx_standard() == "gnu++20"
    assert check.nanobind_definitions() == ["NB_DOMAIN=mlx"]
    assert "-D_METAL_" in check.mlx_mac_flags()
    assert all(u.exists() for u in UNITS)
    assert {"src/metal/program.cpp", "src/metal/map_primitive.cpp", "src/bindings/module.cpp"} <= {
        str(u.relative_to(check.ROOT)) for u in UNITS
    }
    # MLX's Metal headers, included through the stand-in.
    assert (check.mlx_include() / "mlx" / "backend" / "metal" / "device.h").exists()
    assert check.nanobind_include() is not None, "nanobind (the test extra) is needed for src/bindings/"
    # The test extra's nanobind is the one the build compiled with.
    project = tomllib.loads((check.ROOT / "pyproject.toml").read_text())
    extras = project["tool"]["scikit-build"]["metadata"]["optional-dependencies"]["value"]
    assert "nanobind=={nanobind}" in extras["test"]


def test_every_source_is_built():
    # A .cpp under src/ that neither list names is compiled by no build.
    text = (check.ROOT / "CMakeLists.txt").read_text()
    listed = set(check._cmake_list(text, "LATTICE_SOURCES")) | set(check._cmake_list(text, "LATTICE_CPU_KERNELS"))
    on_disk = {str(p.relative_to(check.ROOT)) for p in (check.ROOT / "src").rglob("*.cpp")}
    assert on_disk <= listed


def test_builds():
    # Every Mac build with Metal: both libraries, or mlx_lattice.metallib
    # alone (TensorOps failed or switched off). The units that read the
    # definitions are checked in each.
    builds = check.configurations()
    assert builds == {
        "metal": ["MLX_LATTICE_METAL=1"],
        "metal+tensorops": ["MLX_LATTICE_METAL=1", "MLX_LATTICE_TENSOROPS=1"],
    }
    conditional = check.conditional_units(UNITS, check.metal_definitions())
    assert check.ROOT / "src/metal/program.cpp" in conditional
    assert {(b, u) for b in builds for u in conditional} <= set(PLAN)


@pytest.mark.parametrize(
    "build, unit", PLAN, ids=[f"{u.relative_to(check.ROOT)}[{b}]" for b, u in PLAN]
)
def test_unit_compiles_as_on_a_mac(results, build, unit):
    res = results[(build, unit)]
    assert res.ok, (
        f"{unit.relative_to(check.ROOT)} does not compile as a Mac build with Metal ({build}; "
        f"{_compiler().describe()}):\n{res.output[-6000:]}"
    )


def _selftest_cases():
    cases = []
    for path in sorted(SELFTEST.glob("*.cpp")):
        lines = path.read_text().splitlines()
        marks = {}
        for i, line in enumerate(lines, 1):
            m = re.search(r"MACHOST-ERROR (\d+)", line)
            if m:
                marks[int(m.group(1))] = i
        assert marks, f"{path.name} marks no mistake"
        cases.append(pytest.param(path, 0, None, id=f"{path.stem}-as-written"))
        cases += [pytest.param(path, n, line, id=f"{path.stem}-mistake{n}") for n, line in sorted(marks.items())]
    return cases


SELFTEST_CASES = _selftest_cases()


@pytest.fixture(scope="module")
def selftest_results():
    """Every snippet and mistake, compiled at once (never cached)."""
    compiler = _compiler()
    runs = [(c.values[0], c.values[1]) for c in SELFTEST_CASES]

    def one(run):
        path, variant = run
        extra = (f"-DMACHOST_BAD={variant}",) if variant else ()
        return check.compile_unit(path, compiler, extra, cache=False)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(zip(runs, pool.map(one, runs)))


@pytest.mark.parametrize("path, variant, line", SELFTEST_CASES)
def test_check_rejects_mistakes(selftest_results, path, variant, line):
    res = selftest_results[(path, variant)]
    if variant == 0:
        assert res.ok, res.output
        return
    assert not res.ok, f"{path.name}: mistake {variant} compiled"
    errors = re.findall(r"^(.*?):(\d+):\d+: (?:fatal )?error:", res.output, re.M)
    assert errors, res.output
    where, at = errors[0]
    assert Path(where).name == path.name and int(at) == line, (
        f"{path.name}: first error at {where}:{at}, expected line {line}:\n{res.output}"
    )


def test_standin_headers_stand_alone():
    # Each stand-in header compiles on its own, warning-free.
    compiler = _compiler()
    for header in ("Foundation/Foundation.hpp", "Metal/Metal.hpp"):
        out = check._run(
            [compiler.command, "-x", "c++", f"-std={check.cxx_standard()}", *compiler.stdlib, "-fsyntax-only",
             "-Wall", "-Wextra", "-Werror", "-I", str(check.STANDIN), "-"],
            input=f"#include <{header}>\n", timeout=120,
        )
        assert out.returncode == 0, out.stderr


def test_checked_with_libcxx():
    # Apple's standard library is libc++: with libstdc++ a header that it
    # includes transitively can hide a missing #include that breaks on a Mac.
    compiler = _compiler()
    if not compiler.stdlib:
        message = f"the check used libstdc++ ({compiler.describe()}): install libc++ (Debian: libc++-16-dev)"
        if os.environ.get("MLX_LATTICE_REQUIRE_LIBCXX") == "1":
            pytest.fail(f"MLX_LATTICE_REQUIRE_LIBCXX=1 but {message}")
        pytest.skip(message)
