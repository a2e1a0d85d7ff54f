"""The Metal harness's strict pass (tests/metal/metal_harness/strict.py): each rule
has a planted defect in selftest/strict/ that must fail to build with
'<file>:<line>: [rule]', the line being the one marked `// defect`; every
kernel in metal/ must pass.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

try:
    import metal_harness as mh
    from metal_harness import build, strict
except ImportError:  # tests/ imported as a package
    from tests.metal import metal_harness as mh
    from tests.metal.metal_harness import build, strict

_ok, _why = mh.available()
pytestmark = [pytest.mark.metal, pytest.mark.skipif(not _ok, reason=_why)]

STRICT = Path(mh.__file__).parent / "selftest" / "strict"

# file stem -> (rule, a phrase of the message)
PLANTED = {
    "double": ("double", "MSL has no double"),
    "long_long": ("long-long", "MSL has no long long"),
    "goto": ("goto", "does not support goto"),
    "virtual": ("virtual", "virtual functions"),
    "exceptions": ("exceptions", "exceptions"),
    "new_delete": ("new-delete", "new and delete"),
    "thread_local": ("thread_local", "thread_local"),
    "register": ("register", "register storage class"),
    "dynamic_cast": ("dynamic_cast", "dynamic_cast"),
    "typeid": ("typeid", "typeid"),
    "noexcept": ("noexcept", "noexcept operator"),
    "lambda": ("lambda", "lambda expressions"),
    "std_namespace": ("std", "standard library is not available in MSL (std::)"),
    "std_include": ("std", "(#include <array>)"),
    "space_threadgroup_to_device": ("address-space", "from 'threadgroup float[32]' to 'device float *'"),
    "space_device_to_thread": ("address-space", "'float *' with an lvalue of type 'device float *'"),
    "space_constant_to_device": ("address-space", "address space 'constant' as a pointer to address space 'device'"),
    "space_reference": ("address-space", "changes address space"),
    "space_vector_pointer": ("address-space", "address space 'device' as a pointer to address space 'threadgroup'"),
    "space_struct_reference": ("address-space", "cannot bind reference in address space 'constant'"),
    "space_kernel_parameter": ("address-space", "without an address space"),
    "space_bfloat_pointer": ("address-space", "cannot pass pointer to address space 'device' as a pointer to generic"),
    "version_tensor": ("version", "<metal_tensor> needs Metal 4.0; this file compiles as Metal 3.1"),
    "tensorops_store_type": ("tensor-ops", "Tensor datatype does not match cooperative tensor"),
    "tensorops_load_type": ("tensor-ops", "Tensor datatype does not match cooperative tensor"),
    "tensorops_rank": ("tensor-ops", "rank-2 tensors"),
    "tensorops_index64": ("tensor-ops", "64-bit extents are not supported"),
    "tensorops_types": ("tensor-ops", "does not support this combination"),
    "tensorops_constant_space": ("tensor-ops", "not constant"),
    "tensorops_scope": ("tensor-ops", "Scope template argument is an execution scope"),
    "tensorops_element_space": ("tensor-ops", "element type is unqualified"),
}


def defect_line(path: Path) -> int:
    lines = [i for i, text in enumerate(path.read_text().splitlines(), 1) if "// defect" in text]
    assert len(lines) == 1, f"{path.name}: mark exactly one line '// defect'"
    return lines[0]


def test_every_planted_file_is_listed():
    stems = {p.stem for p in STRICT.glob("*.metal")}
    accepted = {
        "tensorops_decltype_ok", "space_class_objects_ok", "space_bfloat_ok", "version_atomic_float", "version_bfloat",
    }
    assert stems - accepted == set(PLANTED)


@pytest.mark.parametrize("stem", sorted(PLANTED))
def test_planted_defect_fails_to_build_at_its_line(stem):
    path = STRICT / f"{stem}.metal"
    rule, phrase = PLANTED[stem]
    with pytest.raises(mh.HarnessError) as err:
        mh.load(path)
    text = str(err.value)
    where = f"{path.name}:{defect_line(path)}: [{rule}]"
    assert where in text, text
    line = next(ln for ln in text.splitlines() if where in ln)
    assert phrase in line, text
    assert "not valid Metal" in text


@pytest.mark.parametrize(
    ("stem", "version", "phrase"),
    [
        ("version_atomic_float", 240, "atomic_float needs Metal 3.0; this file compiles as Metal 2.4"),
        ("version_bfloat", 300, "bfloat needs Metal 3.1; this file compiles as Metal 3.0"),
    ],
)
def test_features_above_the_language_version(stem, version, phrase, tmp_path):
    # Every file in the build is 3.1 or 4.0: older versions are checked on
    # the rule itself, and the file builds at its own version.
    path = STRICT / f"{stem}.metal"
    found = strict.scan_rules(build.scan(path), version)
    assert [str(v) for v in found if v.rule == "version"] == [
        f"{path.relative_to(build.ROOT)}:{defect_line(path)}: [version] {phrase}"
    ]
    mh.load(path)


def test_decltype_operands_with_reference_cv_and_space_are_accepted():
    mh.load(STRICT / "tensorops_decltype_ok.metal")


def test_class_objects_copy_across_spaces():
    mh.load(STRICT / "space_class_objects_ok.metal")


def test_bfloat_values_in_device_memory_are_accepted():
    # A scalar in MSL, a class in the shim: reading and writing it in device
    # memory (directly and as a template parameter) is valid Metal.
    mh.load(STRICT / "space_bfloat_ok.metal")


def test_language_versions_come_from_the_cmake_build():
    text = (build.ROOT / "CMakeLists.txt").read_text()
    metal = re.findall(r"^\s*set\(LATTICE_METAL_STD metal(\d)\.(\d)\)", text, re.M)
    tensorops = re.findall(r"^\s*set\(LATTICE_TENSOROPS_STD metal(\d)\.(\d)\)", text, re.M)
    assert len(metal) == len(tensorops) == 1
    expected = {
        "metal": int(metal[0][0]) * 100 + int(metal[0][1]) * 10,
        "tensorops": int(tensorops[0][0]) * 100 + int(tensorops[0][1]) * 10,
    }
    assert strict.language_versions() == expected
    assert strict.version_for(Path("metal/tensorops_sorted.metal")) == expected["tensorops"]
    assert strict.version_for(Path("metal/gather_conv.metal")) == expected["metal"]


def test_language_version_lines_must_be_unique(tmp_path):
    cmake = tmp_path / "CMakeLists.txt"
    cmake.write_text("set(LATTICE_METAL_STD metal3.1)\nset(LATTICE_METAL_STD metal3.2)\n"
                     "set(LATTICE_TENSOROPS_STD metal4.0)\n")
    with pytest.raises(strict.StrictError, match=r"exactly one 'set\(LATTICE_METAL_STD metalX.Y\)' line, found 2"):
        strict.language_versions(cmake)
    cmake.write_text("set(LATTICE_METAL_STD metal3.1)\nset(LATTICE_TENSOROPS_STD ios18)\n")
    with pytest.raises(strict.StrictError, match=r"LATTICE_TENSOROPS_STD is 'ios18', expected metalX.Y"):
        strict.language_versions(cmake)


def test_scan_defines_the_file_version(tmp_path):
    versions = strict.language_versions()
    for name, key in (("probe.metal", "metal"), ("tensorops_probe.metal", "tensorops")):
        probe = tmp_path / name
        probe.write_text("constant int v = __METAL_VERSION__;\n")
        assert f"constant int v = {versions[key]};" in build.scan(probe)


def test_missing_clang_is_an_error_not_a_skip(monkeypatch):
    monkeypatch.setenv("MLX_LATTICE_HARNESS_CLANG", "clang++-does-not-exist")
    with pytest.raises(strict.StrictError, match=r"needs clang >= 15.*ziglang.*apt-get install -y clang-16"):
        strict.find_clang()


METAL_SOURCES = sorted((build.ROOT / "metal").rglob("*.metal"))


def test_the_project_has_metal_sources():
    assert any(p.name.startswith(strict.TENSOROPS_PREFIX) for p in METAL_SOURCES)
    assert any(not p.name.startswith(strict.TENSOROPS_PREFIX) for p in METAL_SOURCES)


@pytest.mark.parametrize("path", METAL_SOURCES, ids=lambda p: p.name)
def test_every_project_kernel_passes_the_strict_pass(path):
    text = build.scan(path)
    assert strict.scan_rules(text, strict.version_for(path)) == []
    assert strict.clang_check(text, strict.version_for(path), build.cache_dir()) == []
