"""The Metal build logic of cmake/metal.cmake, run in CMake script mode with
stub `xcrun` and `sw_vers` programs standing in for Apple's tools.

What a real Xcode does with our sources only a Mac shows (docs/mac.md); these
tests pin what the build does with each answer the tools can give: Metal
compiles, TensorOps does not, no Metal toolchain, no xcrun at all.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _find_cmake() -> tuple[str | None, str, bool]:
    """The cmake executable itself (not a shim), so that it runs with PATH
    holding only the stub tools: (path, "", False), or (None, why not,
    whether that is a skip: no cmake, or one older than the build needs).

    It is asked through a script file: some CMake releases (Debian 12's
    3.25) cannot read a script from a pipe (`-P /dev/stdin`), and their
    error text is no path.
    """
    found = shutil.which("cmake")
    if found is None:
        return None, "needs cmake on PATH", True
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "where.cmake"
        script.write_text('message("${CMAKE_COMMAND}")\nmessage("${CMAKE_VERSION}")\n')
        try:
            proc = subprocess.run([found, "-P", str(script)], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"`{found} -P` could not run: {e}", False
    # message() without a mode writes to stderr
    lines = proc.stderr.strip().splitlines()
    if proc.returncode != 0 or len(lines) != 2:
        output = (proc.stdout + proc.stderr).strip()[-2000:]
        return None, f"`{found} -P {script.name}` exited {proc.returncode} without naming itself:\n{output}", False
    path, version = lines
    if not (os.path.isabs(path) and os.path.isfile(path) and os.access(path, os.X_OK)):
        return None, f"`{found} -P` named {path!r} as CMAKE_COMMAND, which is no executable", False
    numbers = re.match(r"(\d+)\.(\d+)", version)
    if numbers is None:
        return None, f"`{found} -P` reported CMAKE_VERSION {version!r}", False
    if tuple(map(int, numbers.groups())) < CMAKE_MINIMUM:
        return None, "needs cmake >= {}.{} (CMakeLists.txt's minimum), found {} at {}".format(
            *CMAKE_MINIMUM, version, path), True
    return path, "", False


# CMakeLists.txt's cmake_minimum_required (pinned by a test below).
CMAKE_MINIMUM = (3, 25)
CMAKE, CMAKE_PROBLEM, CMAKE_MISSING = _find_cmake()


@pytest.fixture
def cmake() -> str:
    """The cmake executable for the tests that run CMake: they skip without
    one (or with one older than the build needs), and fail when the one on
    PATH does not work."""
    if CMAKE is None:
        if CMAKE_MISSING:
            pytest.skip(CMAKE_PROBLEM)
        pytest.fail(CMAKE_PROBLEM, pytrace=False)
    return CMAKE


# A cmake stand-in for the probe itself: answers `-P <script>` as
# $STUB_CMAKE says.
CMAKE_STUB = textwrap.dedent(
    """\
    #!{python}
    import os, sys
    mode = os.environ["STUB_CMAKE"]
    assert sys.argv[1] == "-P" and os.path.isfile(sys.argv[2]), sys.argv
    if mode == "no-pipe":  # what 3.25 says when handed /dev/stdin
        sys.stderr.write("CMake Error in {{0}}:\\n  Error while reading Byte-Order-Mark.  "
                         "File not seekable?\\n".format(sys.argv[2]))
        sys.exit(1)
    sys.stderr.write({{"ok": sys.argv[0], "bogus": "not a path"}}.get(mode, sys.argv[0]) + "\\n")
    sys.stderr.write({{"old": "3.22.1"}}.get(mode, "3.25.1") + "\\n")
    """
)


@pytest.mark.parametrize("mode", ["ok", "no-pipe", "bogus", "old", "absent"])
def test_cmake_probe_never_takes_error_text_for_a_path(tmp_path, monkeypatch, mode):
    if mode != "absent":
        stub = tmp_path / "cmake"
        stub.write_text(CMAKE_STUB.format(python=sys.executable))
        stub.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("STUB_CMAKE", mode)
    path, problem, skip = _find_cmake()
    if mode == "ok":
        assert (path, problem, skip) == (str(tmp_path / "cmake"), "", False)
        return
    assert path is None
    if mode == "no-pipe":
        assert not skip and "exited 1" in problem and "Byte-Order-Mark" in problem
    elif mode == "bogus":
        assert not skip and "'not a path'" in problem and "no executable" in problem
    elif mode == "old":
        assert skip and problem.startswith("needs cmake >= 3.25") and "found 3.22.1" in problem
    else:
        assert skip and problem == "needs cmake on PATH"


# xcrun stand-in: logs every call as one JSON line, then behaves as
# $STUB_XCRUN_MODE says: ok, no-toolchain (Xcode 26 without the Metal
# Toolchain component), or tensorops-fails (a newer compiler that rejects the
# Metal 4 sources).
XCRUN = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys
    args = sys.argv[1:]
    with open(os.environ["STUB_LOG"], "a") as f:
        f.write(json.dumps(args) + "\\n")
    mode = os.environ.get("STUB_XCRUN_MODE", "ok")
    if mode == "no-toolchain":
        sys.stderr.write("error: cannot execute tool 'metal' due to missing Metal Toolchain; "
                         "use: xcodebuild -downloadComponent MetalToolchain\\n")
        sys.exit(72)
    if "--version" in args:
        print("Apple metal version " + ("32023.830" if mode == "tensorops-fails" else "32023.404"))
        sys.exit(0)
    if "-c" in args:
        src = args[args.index("-c") + 1]
        if mode == "tensorops-fails" and os.path.basename(src).startswith("tensorops_"):
            sys.stderr.write(src + ":12:5: warning: unused variable\\n")
            sys.stderr.write(src + ":40:9: error: static_assert failed: "
                             "\\"Tensor datatype does not match cooperative tensor\\"\\n")
            sys.exit(1)
    out = args[args.index("-o") + 1]
    with open(out, "w") as f:
        f.write("stub " + " ".join(args))
    """
)

SW_VERS = "#!{python}\nimport os, sys\nv = os.environ.get('STUB_MACOS')\nprint(v) if v else sys.exit(1)\n"

# Calls the functions as CMakeLists.txt does and writes what they decided.
DRIVER = textwrap.dedent(
    """\
    include(${ROOT}/cmake/metal.cmake)
    lattice_macos_deployment_target(target)
    lattice_metal_libraries(
      SOURCE_DIR ${SOURCE_DIR} OUTPUT_DIRECTORY ${OUT}
      METAL_STD metal3.1 TENSOROPS_STD metal4.0 TENSOROPS_TARGET 26.2
      DEPLOYMENT_TARGET ${target} TENSOROPS ${TENSOROPS}
      INCLUDE_DIRS /opt/mlx/include)
    lattice_write_build_info(${OUT}/build_info.json
      deployment_target "${target}"
      metal_built ${LATTICE_METAL_BUILT} metal_reason "${LATTICE_METAL_REASON}"
      tensorops_built ${LATTICE_TENSOROPS_BUILT} tensorops_reason "${LATTICE_TENSOROPS_REASON}")
    """
)


def _metal_sources(tmp_path):
    src = tmp_path / "metal"
    src.mkdir()
    for name in ("gather_conv.metal", "sorted_gemm.metal", "tensorops_sorted.metal",
                 "tensorops_quantized.metal", "conv_params.h"):
        (src / name).write_text(f"// {name}\n")
    return src


def configure(tmp_path, mode="ok", xcrun=True, macos=None, env_target=None, tensorops="ON",
              source_dir=None):
    """Run the driver with the stubs; returns (build info, xcrun calls, output)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tools = {"sw_vers": SW_VERS}
    if xcrun:
        tools["xcrun"] = XCRUN
    for name, text in tools.items():
        p = bin_dir / name
        p.write_text(text.format(python=sys.executable))
        p.chmod(0o755)
    out = tmp_path / "build"
    out.mkdir(exist_ok=True)
    driver = tmp_path / "driver.cmake"
    driver.write_text(DRIVER)
    log = tmp_path / "xcrun.log"
    env = {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path),
        "STUB_LOG": str(log),
        "STUB_XCRUN_MODE": mode,
    }
    if macos:
        env["STUB_MACOS"] = macos
    if env_target is not None:
        env["MACOSX_DEPLOYMENT_TARGET"] = env_target
    source_dir = source_dir or _metal_sources(tmp_path)
    proc = subprocess.run(
        [CMAKE, f"-DROOT={ROOT}", f"-DSOURCE_DIR={source_dir}", f"-DOUT={out}",
         f"-DTENSOROPS={tensorops}", "-P", str(driver)],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads((out / "build_info.json").read_text())
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return info, calls, out, proc.stdout + proc.stderr


def _compiles(calls):
    return {Path(c[c.index("-c") + 1]).name: c for c in calls if "-c" in c}


@pytest.mark.usefixtures("cmake")
def test_both_libraries_with_their_language_versions_and_targets(tmp_path):
    info, calls, out, _ = configure(tmp_path, macos="15.6.1")
    assert info["metal_built"] and info["tensorops_built"], info
    assert info["metal_reason"] == "" and info["tensorops_reason"] == ""
    assert (out / "mlx_lattice.metallib").is_file()
    assert (out / "mlx_lattice_tensorops.metallib").is_file()
    compiles = _compiles(calls)
    assert set(compiles) == {"gather_conv.metal", "sorted_gemm.metal", "tensorops_sorted.metal",
                             "tensorops_quantized.metal"}
    for name, args in compiles.items():
        assert args[:3] == ["-sdk", "macosx", "metal"]
        assert "-fno-fast-math" in args and "-I/opt/mlx/include" in args
        if name.startswith("tensorops_"):
            assert "-std=metal4.0" in args and "-mmacosx-version-min=26.2" in args
        else:
            # the host's macOS version when MACOSX_DEPLOYMENT_TARGET is unset
            assert "-std=metal3.1" in args and "-mmacosx-version-min=15.6.1" in args
    links = [c for c in calls if "-c" not in c and "--version" not in c]
    assert [Path(c[-1]).name for c in links] == ["mlx_lattice.metallib", "mlx_lattice_tensorops.metallib"]
    assert "-mmacosx-version-min=26.2" in links[1]


@pytest.mark.usefixtures("cmake")
def test_unchanged_sources_are_not_recompiled(tmp_path):
    src = _metal_sources(tmp_path)
    _, calls, _, _ = configure(tmp_path, source_dir=src)
    def n_compiles():
        return sum("-c" in c for c in calls)

    assert n_compiles() == 4
    _, calls, _, _ = configure(tmp_path, source_dir=src)
    assert n_compiles() == 4  # the log accumulates: the second run compiled nothing
    (src / "conv_params.h").write_text("// changed header\n")
    _, calls, _, _ = configure(tmp_path, source_dir=src)
    assert n_compiles() == 8  # a header change rebuilds both libraries


@pytest.mark.usefixtures("cmake")
def test_tensorops_failure_keeps_the_build_going(tmp_path):
    info, _, out, log = configure(tmp_path, mode="tensorops-fails", macos="26.2")
    assert info["metal_built"] and not info["tensorops_built"]
    assert (out / "mlx_lattice.metallib").is_file()
    assert not (out / "mlx_lattice_tensorops.metallib").exists()
    reason = info["tensorops_reason"]
    # the first error, not the first diagnostic, with the file that failed
    assert reason.startswith("tensorops_quantized.metal does not compile with -std=metal4.0")
    assert "Tensor datatype does not match cooperative tensor" in reason
    assert "warning" not in reason


@pytest.mark.usefixtures("cmake")
def test_a_new_compiler_rebuilds_and_a_failed_library_is_removed(tmp_path):
    src = _metal_sources(tmp_path)
    configure(tmp_path, source_dir=src)
    info, _, out, _ = configure(tmp_path, mode="tensorops-fails", source_dir=src)
    assert not info["tensorops_built"]
    assert not (out / "mlx_lattice_tensorops.metallib").exists()


@pytest.mark.usefixtures("cmake")
@pytest.mark.parametrize("xcrun", [True, False], ids=["xcode-without-metal-toolchain", "no-xcrun"])
def test_missing_toolchain_gives_a_cpu_only_build_with_install_advice(tmp_path, xcrun):
    info, calls, out, _ = configure(tmp_path, mode="no-toolchain", xcrun=xcrun)
    assert not info["metal_built"] and not info["tensorops_built"]
    assert not list(out.glob("*.metallib"))
    assert "xcodebuild -downloadComponent MetalToolchain" in info["metal_reason"]
    assert "xcode-select" in info["metal_reason"]
    assert info["tensorops_reason"] == "no Metal toolchain"
    if xcrun:
        assert "missing Metal Toolchain" in info["metal_reason"]
        assert calls == [["-sdk", "macosx", "metal", "--version"]]  # nothing compiled
    else:
        assert info["metal_reason"].startswith("xcrun not found")


@pytest.mark.usefixtures("cmake")
def test_tensorops_option_off(tmp_path):
    info, calls, out, _ = configure(tmp_path, tensorops="OFF")
    assert info["metal_built"] and not info["tensorops_built"]
    assert "MLX_LATTICE_TENSOROPS=OFF" in info["tensorops_reason"]
    assert not any(Path(a).name.startswith("tensorops_") for c in calls for a in c)


@pytest.mark.usefixtures("cmake")
@pytest.mark.parametrize(
    "env_target, host, expected",
    [
        ("15.0", "26.2", "15.0"),   # the environment wins
        (None, "26.2", "26.2"),     # else the host's version
        (None, "13.6", "14.0"),     # never below 14.0
        ("11.0", "26.2", "14.0"),
        (None, None, "14.0"),       # no sw_vers answer
        ("not-a-version", "15.1", "15.1"),
    ],
)
def test_deployment_target(tmp_path, env_target, host, expected):
    info, calls, _, log = configure(tmp_path, macos=host, env_target=env_target)
    assert info["deployment_target"] == expected
    main = _compiles(calls)["gather_conv.metal"]
    assert f"-mmacosx-version-min={expected}" in main
    if env_target == "not-a-version":
        assert "ignoring MACOSX_DEPLOYMENT_TARGET" in log


@pytest.mark.usefixtures("cmake")
def test_build_info_escapes_reasons(tmp_path):
    path = tmp_path / "info.json"
    script = tmp_path / "w.cmake"
    script.write_text(
        f"include({ROOT}/cmake/metal.cmake)\n"
        f'lattice_write_build_info({path} a "say \\"hi\\" \\\\ there" b TRUE c OFF d "")\n'
    )
    subprocess.run([CMAKE, "-P", str(script)], check=True, capture_output=True, timeout=60)
    assert json.loads(path.read_text()) == {"a": 'say "hi" \\ there', "b": True, "c": False, "d": ""}


def test_cmakelists_uses_the_functions_and_keeps_the_language_lines():
    text = (ROOT / "CMakeLists.txt").read_text()
    assert text.startswith("cmake_minimum_required(VERSION {}.{})\n".format(*CMAKE_MINIMUM))
    # tests/metal/metal_harness compiles each file at the version these lines set
    assert re.search(r"^set\(LATTICE_METAL_STD metal3\.1\)$", text, re.M)
    assert re.search(r"^set\(LATTICE_TENSOROPS_STD metal4\.0\)$", text, re.M)
    assert "set(LATTICE_TENSOROPS_TARGET 26.2)" in text
    assert "lattice_metal_libraries(" in text and "lattice_macos_deployment_target(" in text
    # the deployment target is chosen before project(), so the C++ code shares it
    assert text.index("lattice_macos_deployment_target(") < text.index("project(mlx_lattice")
    # no build-time Metal step that could fail the install; only release
    # wheels (an option, off by default) insist on both libraries
    assert "mlx_build_metallib" not in text and "FATAL_ERROR" not in text
    assert 'option(MLX_LATTICE_REQUIRE_METAL "' in text and text.split(
        'option(MLX_LATTICE_REQUIRE_METAL "')[1].split("\n")[0].endswith(" OFF)")


@pytest.mark.usefixtures("cmake")
@pytest.mark.parametrize(
    "args, message",
    [("TRUE x TRUE y", None),
     ("FALSE \"no toolchain\" FALSE z", "mlx_lattice.metallib was not built: no toolchain"),
     ("TRUE \"\" FALSE \"static_assert\"", "mlx_lattice_tensorops.metallib was not built: static_assert")],
)
def test_release_wheels_require_both_libraries(tmp_path, args, message):
    script = tmp_path / "r.cmake"
    script.write_text(f"include({ROOT}/cmake/metal.cmake)\nlattice_require_metal({args})\n")
    proc = subprocess.run([CMAKE, "-P", str(script)], capture_output=True, text=True, timeout=60)
    if message is None:
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode != 0 and message in " ".join(proc.stderr.split())  # CMake wraps lines


def test_installed_build_info_matches_this_build():
    from mlx_lattice import diagnostics

    info = diagnostics.build_info()
    assert info["system"] in ("Linux", "Darwin")
    if sys.platform != "darwin":
        assert not info["metal_built"] and info["metal_reason"] == "not a macOS build"


def test_gpu_call_without_metallib_runs_on_the_cpu_on_record(monkeypatch, request):
    """MLX's default device is a Metal GPU but this install has no usable
    mlx_lattice.metallib: the call runs on the CPU and the record says why."""
    import mlx.core as mx
    import numpy as np

    import mlx_lattice as ml
    from mlx_lattice import diagnostics, ops, routes

    rng = np.random.default_rng(0)
    coords = np.unique(rng.integers(0, 6, (60, 4)), axis=0).astype(np.int32)
    coords[:, 0] = 0
    coords = np.unique(coords, axis=0)
    x = ml.SparseTensor(coords, mx.array(rng.standard_normal((len(coords), 5)).astype(np.float32)))
    w = mx.array(rng.standard_normal((7, 3, 3, 3, 5)).astype(np.float32))
    with mx.stream(mx.cpu):  # the fallback's result: the CPU route's, bit for bit
        expected = np.array(ops.subm_conv3d(x, w).feats)

    from mlx_lattice import backends
    from mlx_lattice.backends import build, metal

    monkeypatch.setattr(backends, "current", lambda stream=None: backends.get("metal"))
    monkeypatch.setattr(build, "build_info", lambda: {
        "metal_built": False, "metal_reason": "no Metal toolchain here", "tensorops_built": False})
    build.forget()  # the libraries are looked up once per process: again
    request.addfinalizer(build.forget)
    with diagnostics.record() as log:
        y = ops.subm_conv3d(x, w)
    np.testing.assert_array_equal(np.array(y.feats), expected)
    (entry,) = log
    assert entry["backend"] == "cpu" and entry["route"].startswith("cpu.")
    assert entry["fallback"] == (
        "mlx_lattice.metallib unavailable: no Metal toolchain here; running on the CPU")

    # with a usable library the same call would stay on the GPU
    monkeypatch.setattr(metal, "metal_unavailable_reason", lambda: None)
    assert backends.get("metal").unusable_reason() is None
    assert backends.CPU.unusable_reason() is None and backends.get("cuda").unusable_reason() is None


def test_import_without_an_mlx_backend_says_what_to_install():
    # what `import mlx.core` does on Linux when only the mlx wheel is there
    code = (
        "import sys\n"
        "class NoBackend:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'mlx.core':\n"
        "            raise ImportError('libmlx.so: cannot open shared object file')\n"
        "sys.meta_path.insert(0, NoBackend())\n"
        "import mlx_lattice\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: mlx_lattice needs MLX with a backend")
    assert "libmlx.so: cannot open shared object file" in last
    assert 'mlx_lattice[cpu]' in last and 'mlx_lattice[cuda]' in last


@pytest.mark.usefixtures("cmake")
@pytest.mark.parametrize(
    "processor, choice, expected",
    [("x86_64", "all", "avx512=2;avx2=1;baseline=0 all"),
     ("AMD64", "all", "avx512=2;avx2=1;baseline=0 all"),
     ("aarch64", "native", "neon=3 all"),
     ("arm64", "all", "neon=3 all"),
     ("x86_64", "avx2", "must be native or all, not 'avx2'"),
     ("x86_64", "", "must be native or all, not ''")],
)
def test_cpu_kernel_paths(tmp_path, processor, choice, expected):
    # cmake/cpu_paths.cmake in script mode (where `native` on x86-64, which
    # runs a probe, cannot be asked: the built extension's paths are checked
    # against the CPU in tests/test_cpu_isa.py).
    script = tmp_path / "p.cmake"
    script.write_text("cmake_minimum_required(VERSION {}.{})\n".format(*CMAKE_MINIMUM)
                      + f"set(CMAKE_SYSTEM_PROCESSOR {processor})\nset(MLX_LATTICE_CPU_PATHS \"{choice}\")\n"
                      f"include({ROOT}/cmake/cpu_paths.cmake)\nlattice_cpu_paths(P)\n"
                      'message("${P} ${P_BUILT}")\n')
    proc = subprocess.run([CMAKE, "-P", str(script)], capture_output=True, text=True, timeout=60)
    if "must be" in expected:
        assert proc.returncode != 0 and expected in " ".join(proc.stderr.split())
    else:
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.strip() == expected
