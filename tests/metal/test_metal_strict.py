"""The Metal harness's strict pass (tests/metal/metal_harness/strict.py,
opencl.py, analysis.py): each rule of the specification walk (the harness
README's table) has a planted defect in selftest/strict/ that must fail to
build with '<file>:<line>: [rule]', the line being the one marked
`// defect`; the `*_ok` files and every kernel in metal/ must pass.
"""

from __future__ import annotations

import re
import sys
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
    # clang in C++-for-OpenCL mode (opencl.py) and mh/opencl.h's library rules
    "program_scope_device": ("program-scope", "program scope variable must reside in constant address space"),
    "program_scope_threadgroup": ("program-scope", "program scope variable must reside in constant address space"),
    "program_scope_plain": ("program-scope", "program scope variable must reside in constant address space"),
    "static_local": ("program-scope", "static local variable must reside in constant address space"),
    "constant_uninitialized": ("constant-init", "variable in constant address space must be initialized"),
    "constant_write": ("read-only", "cannot assign to variable 'p' with const-qualified type"),
    "const_device_write": ("read-only", "read-only variable is not assignable"),
    "threadgroup_in_helper": ("threadgroup-scope", "non-kernel function variable cannot be declared in threadgroup"),
    "threadgroup_initializer": ("threadgroup-init", "'threadgroup' variable cannot have an initializer"),
    "device_local": ("address-space", "automatic variable qualified with an address space"),
    "kernel_return": ("kernel-signature", "kernel must have void return type"),
    "kernel_overload": ("kernel-signature", "conflicting types for 'planted'"),
    "function_pointer": ("function-pointer", "has a pointer or reference to a function"),
    "atomic_thread_space": ("atomic", "takes an atomic in device or threadgroup memory"),
    "atomic_type": ("atomic", "MSL's atomic types are"),
    "as_type_size": ("as-type", "needs sizeof(T) == sizeof(x)"),
    "simdgroup_matrix_type": ("simdgroup-matrix", "holds float, half or bfloat"),
    "threadgroup_memory": ("threadgroup-memory",
                           "kernel 'planted_float_8192': its threadgroup variables take more than 32768 bytes"),
    # the strict pass's own analyses (analysis.py)
    "main": ("main", "cannot be named main"),
    "max_threads": ("resource-limit", "[[max_total_threads_per_threadgroup(2048)]]: Apple GPUs run 1 to 1024"),
    "buffer_index": ("resource-limit", "'x' is bound at [[buffer(31)]]; Apple GPUs' buffer table has indices 0 to 30"),
    "buffer_index_twice": ("resource-limit", "'y' and 'x' are both bound at [[buffer(1)]]"),
    "threadgroup_index": ("resource-limit", "[[threadgroup(40)]]"),
    "threadgroup_allocations": ("threadgroup-memory", "32 threadgroup allocations; a kernel has at most 31"),
    "builtin_type": ("builtin", "[[thread_position_in_grid]] is declared 'int'"),
    "builtin_widths": ("builtin", "one number of components (gid: 2, group: 3)"),
    "builtin_twice": ("builtin", "[[threads_per_simdgroup]] is declared twice"),
    "barrier_divergent": ("uniform-control", "threadgroup_barrier is reached under a condition that differs"),
    "barrier_after_helper_return": ("uniform-control",
                                    "threadgroup_barrier is reached under a condition that differs"),
    "barrier_in_helper": ("uniform-control", "sync_group is reached under a condition that differs"),
    "barrier_shared_divergent": ("uniform-control", "threadgroup_barrier is reached under a condition that differs"),
    # kernel parameters: what each attribute binds, built-in types
    "buffer_value": ("kernel-signature", "a buffer binds a device or constant pointer or reference"),
    "buffer_threadgroup": ("kernel-signature", "'tile' [[buffer(n)]] is 'threadgroup float*'"),
    "threadgroup_device": ("kernel-signature", "it binds a threadgroup pointer or reference"),
    "kernel_value_parameter": ("kernel-signature", "'n' ('uint') has no attribute"),
    "builtin_pointer": ("builtin", "is declared 'device uint*'"),
    # the library's types (mh/*.h), through the C++ front end
    "as_type_bool": ("as-type", "other than bool"),
    "bool_vector_from_int": ("compile", "no viable conversion from 'const vec<int, 4>' to 'vec<bool, 4>'"),
    "swizzle_mixed": ("compile", "no member named 'xg'"),
    "vector_cast_width": ("compile", "no matching conversion for static_cast from 'int2'"),
}
# Valid programs the pass must accept: beside each planted defect its
# neighbour `<stem>_ok` (the closest valid program), and these.
ACCEPTED = {
    "tensorops_decltype_ok", "space_class_objects_ok", "space_bfloat_ok", "constant_copy_ok", "msl_names_ok",
    "uniform_ok", "version_atomic_float", "version_bfloat", "barrier_after_return_ok", "threadgroup_nested_scope_ok",
    "recursion", "recursion_mutual", "simd_divergent_ok", "simd_after_return_ok", "matrix_ok", "builtin_inputs_ok",
    "barrier_constant_branch_ok", "function_template_argument_ok",
} | {f"{stem}_ok" for stem in PLANTED}


def defect_line(path: Path) -> int:
    lines = [i for i, text in enumerate(path.read_text().splitlines(), 1) if "// defect" in text]
    assert len(lines) == 1, f"{path.name}: mark exactly one line '// defect'"
    return lines[0]


def test_every_planted_file_is_listed():
    stems = {p.stem for p in STRICT.glob("*.metal")}
    assert stems - ACCEPTED == set(PLANTED)


def test_every_planted_defect_has_a_valid_neighbour():
    # Both directions per rule: the defect fails, its neighbour builds.
    missing = [stem for stem in PLANTED if not (STRICT / f"{stem}_ok.metal").exists()]
    assert not missing, missing


def test_the_readme_table_names_every_self_test():
    # The specification walk: each corpus file appears in the README's table.
    readme = (Path(mh.__file__).parent / "README.md").read_text()
    table = readme[readme.index("## Specification walk"):]
    missing = [p.name for p in sorted(STRICT.glob("*.metal")) if f"`{p.name}`" not in table]
    assert not missing, missing


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


@pytest.mark.parametrize(
    ("stem", "phrase"),
    [
        ("recursion", "recursive call (depth -> depth); MSL functions do not recurse before Metal 2.4"),
        ("recursion_mutual", "recursive call (even_steps -> odd_steps -> even_steps); MSL functions do not recurse"
                             " before Metal 2.4"),
    ],
)
def test_recursion_is_refused_before_metal_2_4(stem, phrase, tmp_path):
    # MSL's restrictions list recursive calls up to 2.3 and none from 2.4 (MLX's
    # utils.h recurses in LoopedElemToLoc::next and builds on every Mac): refused
    # at 2.3, the file builds at its own version.
    path = STRICT / f"{stem}.metal"
    found = strict.violations(build.scan(path), 230, tmp_path)
    where = f"{path.relative_to(build.ROOT)}:{defect_line(path)}: [recursion]"
    assert [str(v) for v in found if v.rule == "recursion"] == [f"{where} {phrase}"], found
    mh.load(path)


@pytest.mark.parametrize("stem", sorted(ACCEPTED))
def test_every_valid_program_builds(stem):
    # The neighbours of the planted defects, and what MSL allows where OpenCL
    # or C++ would not: copies out of constant memory, OpenCL keywords as
    # names, collectives under conditions uniform for their group, barriers
    # after a kernel's divergent return, decltype operands with reference,
    # cv and space, class objects and bfloat values in device memory (a
    # scalar in MSL, a class in the shim), matrices, swizzles, bool vectors,
    # vector casts, every built-in input, branches decided at compile time,
    # functions as template arguments.
    mh.load(STRICT / f"{stem}.metal")


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


@pytest.mark.parametrize("status", [0, 1])
def test_a_clang_whose_version_probe_fails_is_no_candidate(tmp_path, monkeypatch, status):
    # It prints a version line either way; only a probe that exits 0 counts.
    stub = tmp_path / "clang++-stub"
    stub.write_text(f"#!{sys.executable}\nimport sys\nprint('clang version 18.1.8')\nsys.exit({status})\n")
    stub.chmod(0o755)
    monkeypatch.setenv("MLX_LATTICE_HARNESS_CLANG", str(stub))
    if status:
        with pytest.raises(strict.StrictError, match=r"needs clang >= 15"):
            strict.find_clang()
    else:
        assert strict.find_clang() == strict.Clang((str(stub),), "clang version 18.1.8")


METAL_SOURCES = sorted((build.ROOT / "metal").rglob("*.metal"))


def test_the_project_has_metal_sources():
    assert any(p.name.startswith(strict.TENSOROPS_PREFIX) for p in METAL_SOURCES)
    assert any(not p.name.startswith(strict.TENSOROPS_PREFIX) for p in METAL_SOURCES)


@pytest.mark.parametrize("path", METAL_SOURCES, ids=lambda p: p.name)
def test_every_project_kernel_passes_the_strict_pass(path):
    text = build.scan(path)
    assert strict.violations(text, strict.version_for(path), build.cache_dir()) == []


def test_the_runtime_self_tests_planted_defects_are_seen_statically():
    # broken.metal plants defects for the executor; those a static pass can
    # see are found at their lines, and the file declares exactly their rules.
    # Its partial-simdgroup reductions are valid MSL (over the active lanes):
    # only the executor's `strict` option refuses them.
    path = Path(mh.__file__).parent / "selftest" / "broken.metal"
    found = strict.violations(build.scan(path), strict.version_for(path), build.cache_dir())
    lines = path.read_text().splitlines()
    at = {(v.line, v.rule) for v in found}
    for snippet, rule in [("threadgroup_barrier(mem_flags::mem_threadgroup);  // PLANTED", "uniform-control"),
                          ("threadgroup float big[9000];  // PLANTED", "threadgroup-memory")]:
        line = next(i for i, t in enumerate(lines, 1) if snippet in t)
        assert (line, rule) in at, found
    simd = next(i for i, t in enumerate(lines, 1) if "v = simd_sum(v);  // PLANTED" in t)
    assert not any(v.line == simd for v in found), found
    assert strict.expected_rules(path) == {v.rule for v in found}


def test_expected_violations_must_match(tmp_path, monkeypatch):
    src = tmp_path / "probe.metal"
    body = ("#include <metal_stdlib>\nusing namespace metal;\n"
            "kernel void k(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {\n"
            "  if (t < 4) { threadgroup_barrier(mem_flags::mem_threadgroup); }\n}\n")
    src.write_text("// strict-pass: expect uniform-control\n" + body)
    strict.check(src, build.scan(src), 310, tmp_path)
    src.write_text("// strict-pass: expect recursion\n" + body)
    with pytest.raises(strict.StrictError, match=r"expected and not found: \['recursion'\]"):
        strict.check(src, build.scan(src), 310, tmp_path)
    # The project's kernels declare no expected violations.
    (tmp_path / "metal").mkdir()
    kernel = tmp_path / "metal" / "probe.metal"
    kernel.write_text("// strict-pass: expect uniform-control\n" + body)
    monkeypatch.setattr(strict, "ROOT", tmp_path)
    with pytest.raises(strict.StrictError, match="cannot expect strict-pass violations"):
        strict.expected_rules(kernel)
