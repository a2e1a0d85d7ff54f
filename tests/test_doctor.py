"""`python -m mlx_lattice doctor` on this machine, and on Macs simulated by
replacing detection (GPU, macOS version, what the build produced)."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest

import mlx_lattice as ml
from mlx_lattice import __main__ as cli
from mlx_lattice import _ext, backends, diagnostics, doctor, routes
from mlx_lattice.backends import build as build_record
from mlx_lattice.backends import metal as metal_backend

NO_TOOLCHAIN = (
    "the Metal compiler does not run (error: cannot execute tool 'metal' due to missing Metal "
    "Toolchain): install Xcode ..., then `xcodebuild -downloadComponent MetalToolchain`"
)


def run(capsys, *argv):
    rc = cli.main(["doctor", *argv])
    return rc, capsys.readouterr().out


def test_doctor_here(capsys):
    rc, out = run(capsys)
    report = doctor.collect()
    # this machine: whatever it has, the build uses (CI has no Mac GPU)
    assert rc == (1 if report["problems"] else 0)
    for section in ("versions", "backends", "metal libraries", "GPU capability tier",
                    "CPU: instruction set", "CPU heap", "typical layer"):
        assert section in out
    assert f"mlx           {mx.__version__}" in out
    assert report["versions"]["mlx_lattice"] == ml.__version__
    assert report["versions"]["nanobind"] == diagnostics.build_info()["nanobind_version"]
    assert "mlx_lattice.metallib" in out and "mlx_lattice_tensorops.metallib" in out
    assert report["cpu"]["threads"] == ml.num_threads()
    assert report["cpu"]["heap"] == _ext.malloc_tuning()
    assert report["cpu"]["isa"].startswith(_ext.cpu_isa())
    # the typical layer's route is the registry's answer for this backend
    route = report["typical_route"]
    assert route["route"] in routes._REGISTRY
    assert f"{route['route']} on {route['backend']}" in out


def test_doctor_json(capsys):
    rc, out = run(capsys, "--json")
    report = json.loads(out)
    assert set(report) >= {"versions", "backends", "metallibs", "tensor_ops", "gpu_tier", "cpu",
                           "typical_route", "problems"}
    assert report["backends"]["cpu"] == {"machine": True, "usable": True, "reason": None}
    assert rc == (1 if report["problems"] else 0)


def test_cpu_isa_names_the_active_path_and_the_built_ones():
    line = doctor.cpu_isa()
    assert line.startswith(_ext.cpu_isa())
    for isa in _ext.built_cpu_isas():
        assert isa in line


@pytest.fixture
def mac(monkeypatch, tmp_path, request):
    """A simulated Apple10 Mac on macOS 26.2 whose GPU is MLX's default device;
    ``mac(files=..., **build_info)`` sets what the install holds."""

    def setup(files=("mlx_lattice.metallib", "mlx_lattice_tensorops.metallib"), **info):
        for name in files:
            (tmp_path / name).write_bytes(b"metallib")
        build = {"system": "Darwin", "nanobind_version": "3.1.0", "nanobind_abi": "x",
                 "metal_built": True, "metal_reason": "", "tensorops_built": True, "tensorops_reason": ""}
        build.update(info)
        metal = backends.get("metal")
        monkeypatch.setattr(build_record, "build_info", lambda: build)
        monkeypatch.setattr(build_record, "package_dir", lambda: tmp_path)
        monkeypatch.setattr(metal_backend, "gpu_architecture", lambda: "applegpu_g17s")
        monkeypatch.setattr(metal_backend.platform, "mac_ver", lambda: ("26.2", ("", "", ""), "arm64"))
        metal.refresh()  # the device facts are asked once per process: ask again
        request.addfinalizer(metal.refresh)
        monkeypatch.setattr(_ext, "metal_available", lambda: build["metal_built"])
        monkeypatch.setattr(_ext, "metal_tensor_ops_kernels", lambda: build["tensorops_built"])
        monkeypatch.setattr(doctor, "machine_backends", lambda: {"metal": True, "cuda": False})
        monkeypatch.setattr(backends, "current", lambda stream=None: metal)
        return tmp_path

    return setup


def test_mac_with_both_libraries(mac, capsys):
    d = mac()
    rc, out = run(capsys)
    assert rc == 0, out
    report = doctor.collect()
    assert report["backends"]["metal"] == {"machine": True, "usable": True, "reason": None}
    assert report["metallibs"]["metal"]["path"] == str(d / "mlx_lattice.metallib")
    assert report["tensor_ops"] == {"available": True, "reason": None}
    assert report["gpu_tier"] == "metal:applegpu_g17s:macos-26.2:tensorops=yes"
    route = report["typical_route"]
    assert route["backend"] == "metal" and route["route"].startswith("metal.") and not route["fallback"]
    assert str(d / "mlx_lattice_tensorops.metallib") in out and "PROBLEM" not in out


def test_mac_gpu_without_metallib_fails(mac, capsys):
    mac(files=(), metal_built=False, metal_reason=NO_TOOLCHAIN,
        tensorops_built=False, tensorops_reason="no Metal toolchain")
    rc, out = run(capsys)
    assert rc == 1
    assert "PROBLEM: this Mac has a Metal GPU but the build cannot use it" in out
    assert "xcodebuild -downloadComponent MetalToolchain" in out
    report = doctor.collect()
    assert report["backends"]["metal"]["machine"] and not report["backends"]["metal"]["usable"]
    route = report["typical_route"]
    assert route["backend"] == "cpu" and route["fallback"].endswith("running on the CPU")
    assert "missing Metal Toolchain" in route["fallback"]


def test_mac_with_a_metallib_deleted_after_the_build_fails(mac, capsys):
    d = mac(files=("mlx_lattice_tensorops.metallib",))
    rc, out = run(capsys)
    assert rc == 1
    lib = doctor.collect()["metallibs"]["metal"]
    assert not lib["found"] and lib["reason"] == f"mlx_lattice.metallib is missing from {d}"


def test_mac_without_tensorops_library_says_why(mac, capsys):
    why = "tensorops_quantized.metal does not compile with -std=metal4.0: error: static_assert failed"
    mac(files=("mlx_lattice.metallib",), tensorops_built=False, tensorops_reason=why)
    rc, out = run(capsys)
    assert rc == 0  # the GPU is used, without the TensorOps routes
    report = doctor.collect()
    assert report["tensor_ops"]["available"] is False and why in report["tensor_ops"]["reason"]
    assert "tensorops=no (not in this build)" in report["gpu_tier"]
    assert any("supports TensorOps but the build has none" in n for n in report["notes"])
    assert report["typical_route"]["backend"] == "metal"


@pytest.mark.parametrize(
    "arch, macos, reason",
    [("applegpu_g17s", "26.1", "macOS 26.1 is before 26.2"),
     ("applegpu_g16s", "26.2", "before Apple10"),
     ("unknown", "26.2", "no Metal GPU detected")],
)
def test_tensor_ops_reasons(arch, macos, reason):
    caps = diagnostics.metal_capabilities(arch, macos)
    assert not caps["tensor_ops"] and reason in caps["tensor_ops_reason"]
    assert diagnostics.metal_capabilities("applegpu_g17s", "26.2.1")["tensor_ops_reason"] is None
    assert diagnostics.metal_capabilities("applegpu_g18p", "27.0")["tensor_ops"]


def test_nvidia_driver_without_mlx_cuda_is_noted(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "machine_backends", lambda: {"metal": False, "cuda": False})
    monkeypatch.setattr(doctor, "nvidia_driver_present", lambda: True)
    report = doctor.collect()
    assert any("mlx[cuda13]" in n for n in report["notes"])


def test_import_refuses_another_mlx_release():
    # The extension runs only beside the MLX release it was compiled against:
    # another release installed later is an ImportError naming both, not a crash.
    import subprocess
    import sys

    code = (
        "import importlib.metadata as m\n"
        "real = m.version\n"
        "m.version = lambda name: '0.0.1' if name == 'mlx' else real(name)\n"
        "import mlx_lattice\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    built = ml.diagnostics.build_info()["mlx_version"]
    assert f"built against MLX {built}, but MLX 0.0.1 is installed" in out.stderr
    assert "--force-reinstall" in out.stderr and f"mlx=={built}" in out.stderr
