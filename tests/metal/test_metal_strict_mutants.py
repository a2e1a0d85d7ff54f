"""Mutation testing of the strict pass on the project's own kernels: each
metal/*.metal source passes, and defective variants derived from it
mechanically (one per operator, at the first kernel where the operator
applies) are all rejected, by the rule the defect breaks.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

try:
    import metal_harness as mh
    from metal_harness import build, opencl, source, strict
except ImportError:  # tests/ imported as a package
    from tests.metal import metal_harness as mh
    from tests.metal.metal_harness import build, opencl, source, strict

_ok, _why = mh.available()
pytestmark = [pytest.mark.metal, pytest.mark.slow, pytest.mark.skipif(not _ok, reason=_why)]

METAL_SOURCES = sorted((build.ROOT / "metal").glob("*.metal"))
_PER_THREAD = ("thread_index_in_threadgroup", "thread_position_in_threadgroup", "thread_position_in_grid")


def _insert(text: str, at: int, what: str) -> str:
    return text[:at] + what + text[at:]


def _body(text: str, k: opencl.KernelDef) -> int:
    """Offset just inside the kernel's opening brace."""
    return text.index("{", _params_at(text, k) + len(k.params)) + 1


def _params_at(text: str, k: opencl.KernelDef) -> int:
    return text.index(k.params, k.start)


def _shared(text: str, k: opencl.KernelDef) -> list[source.SharedDecl]:
    code = strict._code_only(text)
    return [d for d in source.threadgroup_decls(text[k.start : k.end], code[k.start : k.end], lenient=True)
            if not d.init]


def drop_address_space(text, k):
    m = re.search(r"\b(?:device|constant|threadgroup)\b(?=[^,]*[*&])", strict._code_only(k.params))
    if m:
        at = _params_at(text, k) + m.start()
        return text[:at] + " " * (m.end() - m.start()) + text[m.end() - m.start() + at :]


def write_read_only(text, k):
    for ptype, name, _ in k.param_list():
        if re.search(r"\bdevice\s+const\b|\bconst\s+device\b", ptype) and "*" in ptype:
            return _insert(text, _body(text, k), f" {name}[0] = {name}[0];")
        if re.search(r"\bconstant\b", ptype) and "&" in ptype:
            member = re.search(rf"\b{name}\.(\w+)", text[k.start : k.end])
            if member:
                return _insert(text, _body(text, k), f" {name}.{member.group(1)} = {name}.{member.group(1)};")
            if re.search(r"\b(?:u?(?:int|short|char|long)|float|half|bool|size_t|u?int\d+_t)\s*&", ptype):
                return _insert(text, _body(text, k), f" {name} = {name};")  # MLX's `const constant int& n`


def threadgroup_in_helper(text, k):
    decls = _shared(text, k)
    if decls:
        d = decls[0]
        code = strict._code_only(text)
        head = source.template_start(code, k.start)
        # The kernel's own declaration where it names only the kernel's
        # template parameters and literals; else (a type or size local to
        # the kernel, as in MLX's kernels) a float array: the defect is the
        # declaration's place, not its type.
        names = set(re.findall(r"[A-Za-z_]\w*", d.type + d.dims))
        params = set(source.template_params(code, k.start)) if k.template is not None else set()
        plain = names <= params | {"float", "half", "int", "uint", "short", "ushort", "char", "uchar", "bool",
                                   "long", "ulong", "bfloat"}
        decl = f"{d.type} {d.name}{d.dims}" if plain else "float mh_mutant_tile[32]"
        template = f"template <{k.template}> " if k.template is not None and plain else ""
        helper = f"{template}void mh_mutant_helper() {{ threadgroup {decl}; }} "
        return _insert(text, head if head >= 0 else k.start, helper)


def widen_threadgroup_array(text, k):
    for d in _shared(text, k):
        if d.dims:
            at = k.start + d.start + text[k.start + d.start :].index("[") + 1
            close = source._match_forward(text, at - 1, "[]")
            # Parenthesised: MLX sizes arrays with `c == 0 ? 1 : c`.
            return text[:at] + f"32768 + ({text[at:close]})" + text[close:]


def add_double(text, k):
    return _insert(text, _body(text, k), " double mh_mutant = 0.0; (void)mh_mutant;")


def buffer_index_past_the_table(text, k):
    m = re.search(r"\[\[\s*buffer\s*\(\s*\d+\s*\)\s*\]\]", k.params)
    if m:
        at = _params_at(text, k) + m.start()
        return text[:at] + "[[buffer(31)]]" + text[at + m.end() - m.start() :]


def divergent_barrier(text, k):
    thread = next(((n, t) for t, n, attrs in k.param_list() for a, _ in attrs if a in _PER_THREAD), None)
    m = re.search(r"\bthreadgroup_barrier\s*\(", text[k.start : k.end])
    if thread and m:
        name, ptype = thread
        cond = f"{name}.x == 0" if ptype.rstrip().endswith(("2", "3")) else f"{name} == 0"
        return _insert(text, k.start + m.start(), f"if ({cond}) ")


# operator -> the rule its defect breaks
OPERATORS = {
    drop_address_space: "address-space",
    write_read_only: "read-only",
    threadgroup_in_helper: "threadgroup-scope",
    widen_threadgroup_array: "threadgroup-memory",
    add_double: "double",
    buffer_index_past_the_table: "resource-limit",
    divergent_barrier: "uniform-control",
}


def mutants(path: Path):
    """(operator name, kernel, mutated scanned text, expected rule) for one source."""
    text = build.scan(path)
    for op, rule in OPERATORS.items():
        for k in opencl.kernel_defs(text):
            mutant = op(text, k)
            if mutant is not None:
                yield op.__name__, k.name, mutant, rule
                break


@pytest.mark.parametrize("path", METAL_SOURCES, ids=lambda p: p.name)
def test_every_mutant_of_a_project_kernel_is_rejected(path, tmp_path):
    version = strict.version_for(path)
    assert strict.violations(build.scan(path), version, tmp_path) == []
    made = list(mutants(path))
    assert len(made) >= 3, [m[0] for m in made]  # every source has kernels to mutate
    missed = []
    for op, kernel, text, rule in made:
        found = strict.violations(text, version, tmp_path)
        if rule not in {v.rule for v in found}:
            missed.append(f"{op} on {kernel}: expected [{rule}], got {[str(v) for v in found[:3]]}")
    assert not missed, "\n".join(missed)


def test_the_strict_pass_over_metal_takes_under_30_s(tmp_path):
    # A cold cache: every stage runs for every source, as on a fresh checkout.
    start = time.perf_counter()
    for path in METAL_SOURCES:
        strict.check(path, build.scan(path), strict.version_for(path), tmp_path)
    assert time.perf_counter() - start < 30
