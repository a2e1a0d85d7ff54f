"""The strict pass's OpenCL front end: clang in C++-for-OpenCL mode.

OpenCL's kernel language shares most of MSL's restrictions and clang
enforces them: which address spaces a variable may live in where (program
scope and static locals only `constant`, threadgroup memory only at a
kernel's outermost scope and uninitialised, no `device` locals),
`constant` memory read-only and initialised, kernel signatures (void; a
pointer parameter in device, constant or threadgroup memory; no
overloads), no function pointers or variadic functions. The scanned unit
is rewritten for it:

* device / constant / threadgroup / thread become __global / __constant /
  __local / __private, and MSL's library comes from mh/opencl.h (exact
  types, loose functions, MSL's library rules as tagged static_asserts);
* a template kernel, which OpenCL forbids, becomes one plain kernel per
  [[host_name]] instantiation, named by its host name, with its template
  parameters declared around it (`using T = half;`);
* `float4(a, b)` and kin become `::mh::make<float4>(a, b)` (clang's vectors
  have no constructor syntax); attributes are dropped, [[kernel]] becoming
  __kernel;
* after each threadgroup variable of a kernel, a static_assert that the
  kernel's threadgroup variables so far fit in Apple GPUs' 32 KiB.

Errors are reported at the .metal line (line markers) with MSL's names for
the address spaces. Where OpenCL forbids what MSL allows, that error alone
is dropped (`_msl_allows`) or the unit is rewritten; what MSL forbids and
OpenCL allows is left to the other checks (README, "Strict pass"). The
same clang run dumps its AST as JSON for analysis.ast_rules.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import analysis
from . import source as src
from . import strict

HERE = Path(__file__).resolve().parent
PRELUDE = HERE / "include" / "mh" / "opencl.h"
THREADGROUP_MEMORY_LIMIT = 32 * 1024

# clang -cc1: C++ for OpenCL 2021 (C++17) for a SPIR target. fp16 on (MSL
# has half); fp64 off (MSL has no double); program-scope globals off (MSL
# allows only `constant` there), with the two features that need them.
FLAGS = [
    "-x", "clcpp", "-cl-std=clc++2021", "-triple", "spir64-unknown-unknown", "-fsyntax-only",
    "-cl-ext=+cl_khr_fp16,-cl_khr_fp64,-__opencl_c_fp64,-__opencl_c_program_scope_global_variables,"
    "-__opencl_c_device_enqueue,-__opencl_c_pipes",
    "-ferror-limit", "0", "-w", "-cl-single-precision-constant", f"-I{PRELUDE.parents[1]}", "-include", "mh/opencl.h",
]


# ------------------------------------------------------------ the unit


@dataclass
class KernelDef:
    """A kernel definition in a scanned unit (offsets into its text)."""

    name: str
    start: int  # of its attributes, after any template head
    name_span: tuple[int, int]
    params: str  # the text between its parentheses
    end: int  # one past its closing brace
    template: str | None  # its template parameters, or None
    attrs: list[tuple[str, str]]

    def param_list(self) -> list[tuple[str, str, list[tuple[str, str]]]]:
        """(type, name, attributes) of each parameter."""
        out = []
        for raw in src._split_top(strict._code_only(self.params)) if self.params.strip() else []:
            attrs = src.param_attrs(raw)
            bare = " ".join(re.sub(src._ATTR_BLOCK, " ", raw).split())
            m = re.fullmatch(r"(.*?)\s*\b([A-Za-z_]\w*)", bare)
            out.append((m.group(1), m.group(2), attrs) if m else (bare, "", attrs))
        return out


def kernel_defs(text: str) -> list[KernelDef]:
    code = strict._code_only(text)
    out = []
    for m in src._KERNEL_RE.finditer(code):
        if not _is_kernel(m.group("pre")):
            continue
        close = src._match_forward(code, m.end() - 1)
        if not code[close + 1 : close + 2000].lstrip().startswith("{"):
            continue
        end = src._match_forward(code, code.index("{", close), "{}") + 1
        head = src.template_start(code, m.start())
        template = None
        if head >= 0:
            lt = code.index("<", head)
            template = text[lt + 1 : src._match_forward(code, lt, "<>")]
        out.append(KernelDef(m.group("name"), m.start(), m.span("name"), text[m.end() : close], end, template,
                             src._attr_items(m.group("pre"))))
    return out


@dataclass
class Unit:
    text: str
    kernels: dict[str, tuple[KernelDef, str]]  # function in the unit -> (definition, host name)


def _blank(text: str, start: int, end: int) -> str:
    """text[start:end] as spaces, newlines and line markers kept."""
    lines = text[start:end].split("\n")
    return "\n".join(ln if ln.startswith("# ") else " " * len(ln) for ln in lines)


def _template_bindings(params: str, args: str) -> str:
    """`using T = half; constexpr __constant int C = 32;` for one instantiation."""
    values = [a.strip() for a in src._split_top(args)]
    out = []
    for i, raw in enumerate(src._split_top(params)):
        decl, _, default = (p.strip() for p in raw.partition("="))
        value = values[i] if i < len(values) else default
        m = re.fullmatch(r"(?:typename|class)\s*(?:\.\.\.)?\s*([A-Za-z_]\w*)", decl)
        if m:
            out.append(f"using {m.group(1)} = {value};")
            continue
        m = re.fullmatch(r"(.+?)\s*\b([A-Za-z_]\w*)", decl)
        if not m:
            raise strict.StrictError(f"the OpenCL front end cannot read the template parameter '{decl}'")
        out.append(f"constexpr __constant {m.group(1)} {m.group(2)} = {value};")
    return " ".join(out)


def _shared_memory_asserts(text: str, code: str, start: int, end: int, kernel: str) -> list[tuple[int, str]]:
    """(offset, static_assert) after each threadgroup variable in text[start:end]:
    the kernel's threadgroup variables so far fit in 32 KiB."""
    out, sizes = [], []
    for d in src.threadgroup_decls(text[start:end], code[start:end], lenient=True):
        if d.init:
            continue  # clang refuses the initializer
        sizes.append(f"sizeof({d.type_id})")
        out.append((start + d.end + 1, (
            f" static_assert({' + '.join(sizes)} <= {THREADGROUP_MEMORY_LIMIT}, \"[threadgroup-memory] "
            f"kernel '{kernel}': its threadgroup variables take more than {THREADGROUP_MEMORY_LIMIT} bytes "
            "(Apple GPUs' limit per threadgroup)\");"
        )))
    return out


def _complete_types(params: str) -> str:
    """static_asserts that instantiate the class templates a kernel's pointer
    and reference parameters point to: clang's OpenCL mode refuses a kernel
    parameter whose pointee is a specialisation not yet instantiated."""
    out = []
    for raw in src._split_top(params):
        bare = re.sub(src._ATTR_BLOCK, " ", strict._code_only(raw))
        m = re.fullmatch(r"\s*(.*?)\s*[*&]+\s*(?:const\s*)?[A-Za-z_]\w*\s*", bare, re.S)
        if m and "<" in m.group(1):
            pointee = re.sub(r"\b(?:device|constant|threadgroup|thread|const|volatile)\b", " ", m.group(1))
            out.append(f"static_assert(sizeof({' '.join(pointee.split())}) != 0, \"\");")
    return " ".join(out)


def _edit(text: str, edits: list[tuple[int, int, str]]) -> str:
    return src.apply_edits(text, edits)


def _is_kernel(pre: str) -> bool:
    return bool(re.search(r"\bkernel\b", re.sub(src._ATTR_BLOCK, " ", pre))) or any(
        k == "kernel" for k, _ in src._attr_items(pre)
    )


def _structure(text: str) -> Unit:
    """Template kernels replaced by one plain kernel per instantiation, and
    each kernel's threadgroup-memory asserts."""
    code = strict._code_only(text)
    at = strict.Locator(text)
    edits: list[tuple[int, int, str]] = []
    kernels: dict[str, tuple[KernelDef, str]] = {}
    templates: dict[str, KernelDef] = {}
    for k in kernel_defs(text):
        if k.template is None:
            kernels[k.name] = (k, src.host_name(text[k.start : k.name_span[0]]) or k.name)
            edits += [(p, p, s) for p, s in _shared_memory_asserts(text, code, k.start, k.end, k.name)]
            edits.append((k.start, k.start, _complete_types(k.params)))
            continue
        templates[k.name] = k
        head = src.template_start(code, k.start)
        edits.append((head, k.end, _blank(text, head, k.end)))
    for n, m in enumerate(src._INSTANCE_RE.finditer(code)):
        host = src.host_name(text[m.start("attrs") : m.end("attrs")])
        if host is None:
            continue
        written, args = src._template_id(text[m.start("decl") : m.end("decl")])
        k = templates.get(written.split("::")[-1])
        edits.append((m.start(), m.end(), _blank(text, m.start(), m.end())))
        if k is None:
            continue
        name = re.sub(r"\W", "_", host)
        kernels[name] = (k, host)
        local = [(p - k.start, p - k.start, s) for p, s in _shared_memory_asserts(text, code, k.start, k.end, name)]
        local.append((k.name_span[0] - k.start, k.name_span[1] - k.start, name))
        body = _edit(text[k.start : k.end], local)
        (f0, l0), (f1, l1) = at(k.start), at(m.end())
        edits.append((m.end(), m.end(), (
            f"\nnamespace mh_kernel_{n} {{ {_template_bindings(k.template, args)} {_complete_types(k.params)}\n"
            f"# {l0} \"{f0}\"\n{body}\n}}\n# {l1} \"{f1}\"\n"
        )))
    return Unit(_edit(text, edits), kernels)


_VECTOR_CTOR = re.compile(
    r"(?<![\w.:>])(?:metal\s*::\s*)?((?:bool|char|uchar|short|ushort|int|uint|long|ulong|half|float|bfloat)[234])\s*\("
)


_METHOD_CONSTANT = re.compile(r"\)(?P<quals>(?:\s*\b(?:const|volatile|constant)\b)*\s*\bconstant\b(?:\s*\bconst\b)?)"
                              r"\s*(?=[{;:=]|->)")
_VECTOR_DECL = re.compile(
    r"(?<![\w.:>])(?:metal\s*::\s*)?((?:bool|char|uchar|short|ushort|int|uint|long|ulong|half|float|bfloat)[234])"
    r"\s+([A-Za-z_]\w*)(\s*\()"
)
_METHOD_THREAD = re.compile(r"\)(?P<quals>(?:\s*\b(?:const|volatile|thread)\b)*\s*\bthread\b(?:\s*\bconst\b)?)"
                            r"\s*(?=[{;:=]|->)")


def unit(text: str) -> Unit:
    """The scanned text as a C++-for-OpenCL unit (see the module doc)."""
    u = _structure(text)
    out = u.text
    code = strict._code_only(out)
    edits = []
    for m in re.finditer(src._ATTR_BLOCK, code):
        kernel = any(k == "kernel" for k, _ in src._attr_items(m.group(0)))
        repl = "__kernel" if kernel else ""
        edits.append((m.start(), m.end(), repl.ljust(m.end() - m.start())))
    for m in _VECTOR_CTOR.finditer(code):
        edits.append((m.start(), m.end(), f"::mh::make<{m.group(1)}>("))
    # `float4 v(a, b);` in a function: clang's vectors take no parenthesised
    # initializer either.
    scopes = src._scope_starts(code)
    for m in _VECTOR_DECL.finditer(code):
        scope = scopes[m.start()]
        if scope < 0 or re.search(r"\b(?:struct|class|union|namespace|enum)\b[^;{}()]*$", code[max(0, scope - 300):scope]):
            continue
        edits.append((m.start(3), m.end(), f" = ::mh::make<{m.group(1)}>("))
    for m in re.finditer(r"(?<![\w.:>])(?:metal\s*::\s*)?vec\s*<", code):  # vec<T, N>(a, b)
        try:
            gt = src._match_forward(code, m.end() - 1, "<>")
        except src.SourceError:
            continue
        after = re.match(r"\s*\(", code[gt + 1 : gt + 200])
        if after and not re.search(r"\boperator\s*$", code[: m.start()]):
            edits.append((m.start(), gt + 1 + after.end(), f"::mh::make<metal::vec<{code[m.end() : gt]}>>("))
    # A function-pointer alias (`using RadixFunc = void (*)(...)`, MLX's FFT
    # passes codelets as template arguments): a function type here, which a
    # template parameter adjusts to the pointer OpenCL refuses to spell.
    for m in re.finditer(r"\busing\s+\w+\s*=[^;()]*?(\(\s*\*\s*\))\s*\(", code):
        edits.append((m.start(1), m.end(1), " " * (m.end(1) - m.start(1))))
    # Function constants: program-scope constants whose value the pipeline
    # sets (initialised here so that OpenCL takes them).
    for fc in src.function_constants(code):
        edits.append((fc.start, fc.end, f"__constant {fc.type} {fc.name} = {fc.type}();"))
    # A constructor's `thread` qualifier goes: OpenCL's __private would
    # refuse temporaries and constant evaluation, which have no space.
    # Other methods keep it (`this` private, its members private lvalues).
    scopes = src._scope_starts(code)
    for m in _METHOD_THREAD.finditer(code):
        open_paren = src._open_paren(code, m.start())
        name = re.search(r"([~\w]+)\s*$", code[max(0, open_paren - 200) : open_paren])
        scope = scopes[m.start()]
        owner = re.search(r".*\b(?:struct|class|union)\s+([A-Za-z_]\w*)[^;{}()]*$", code[max(0, scope - 300) : scope],
                          re.S) if scope >= 0 else None
        if not (name and owner and name.group(1) == owner.group(1)):
            continue
        for w in re.finditer(r"\bthread\b", m.group("quals")):
            at = m.start("quals") + w.start()
            edits.append((at, at + len("thread"), " " * len("thread")))
    # A `constant` method qualifier is the space alone (the prelude's
    # `constant` adds const, which a constructor cannot take).
    for m in _METHOD_CONSTANT.finditer(code):
        for w in re.finditer(r"\bconstant\b", m.group("quals")):
            at = m.start("quals") + w.start()
            edits.append((at, at + len("constant"), "__constant"))
    for m in re.finditer(r'^# (\d+) "([^"]*)"((?: \d)+)$', out, re.M):
        edits.append((m.start(3), m.end(3), ""))
    return Unit(_edit(out, edits), u.kernels)


# ------------------------------------------------------------ diagnostics

_SPACES = {"__global": "device", "__constant": "constant", "__local": "threadgroup", "__private": "thread",
           "__generic": "generic"}
_WORDS = [
    (r"\b(?:local|__local) address space\b", "threadgroup address space"),
    (r"\b(?:global|__global) address space\b", "device address space"),
    (r"\bprivate address space\b", "thread address space"),
    (r"'__local' variable", "'threadgroup' variable"),
    (r"\bmh_kernel_\d+::", ""),
    (r"::mh::make<(\w+)>", r"\1"),
]


def msl_names(msg: str) -> str:
    """An OpenCL message in MSL's words."""
    for rx, repl in _WORDS:
        msg = re.sub(rx, repl, msg)
    return re.sub(r"\b__(global|constant|local|private|generic)\b", lambda m: _SPACES["__" + m.group(1)], msg)


def rule_of(msg: str) -> str:
    rule = strict._rule_of(msg)[0]
    return "opencl" if rule == "compile" else rule


_CONSTANT_COPY = re.compile(
    r"candidate (?:constructor|function) \(the implicit (?:copy|move) (?:constructor|assignment operator)\) not viable:"
    r" cannot bind reference in address space '__constant' to object in address space '__generic'"
)


def _msl_allows(group: list[tuple[str, int, str, str]]) -> bool:
    """An error OpenCL raises where MSL has none. Two cases: copying a class
    object out of `constant` memory (OpenCL's implicit copy and move
    constructors and assignments take `generic` references, which exclude
    `constant`; MSL copies objects from any address space; every note of the
    error that names an address space must be one of those); and a braced
    list passed for a vector parameter (`elem_to_loc({x, y, z}, ...)`: MSL
    list-initialises it, clang's vectors take a list only in a declaration;
    the C++ front end, whose vectors are classes, checked that call)."""
    msg = group[0][3]
    if msg.startswith("scalar operand type has greater rank than the type of the vector element. ('double'"):
        return True  # a floating literal in a template (clang keeps it double there; MSL's are float)
    if msg == "excess elements in scalar initializer":
        return True  # `T(a, b)` with T a vector template parameter: the C++ front end's vectors check it
    if msg == "taking address of function is not allowed":
        return True  # a function as a template argument (a pointer variable also meets "pointers to functions")
    if re.match(r"reference of type '[^']*__private[^']*' cannot bind to a temporary object because of address space "
                r"mismatch", msg):
        return True  # a const thread reference to a temporary: OpenCL's temporaries have no space
    if any(kind == "note" and re.search(r"'this' object is in default address space, but method expects object in "
                                        r"address space '__private'", m) for _, _, kind, m in group[1:]):
        return True  # a `thread` method on a temporary, which MSL calls
    m = re.match(r"conditional expression is ambiguous; '([^']*)' and '([^']*)' can be converted"
                 r"|incompatible operand types \('([^']*)' and '([^']*)'\)", msg)
    if m:  # one class type but for cv and address space: MSL converts
        strip = lambda t: " ".join(w for w in t.split() if w not in (
            "const", "__global", "__constant", "__local", "__private", "__generic"))
        a, b = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
        return strip(a) == strip(b) and "*" not in a
    if re.search(r"cast from .* to .* is not allowed", msg) and re.search(r"'half'", msg) and "'__bf16'" in msg:
        return True  # bfloat <-> half, explicitly: MSL converts, clang's __bf16 does not
    if msg.startswith("variables in the local address space can only be declared in the outermost scope"):
        return True  # MSL declares them in any block of a kernel (MLX's sort.h)
    if re.match(r"no matching (?:member )?(?:function for call to|constructor for initialization of)", msg) and any(
            kind == "note" and re.search(r"no known conversion from 'const __constant char\[\d+\]' to "
                                         r"'__constant char \*", m)
            for _, _, kind, m in group[1:]):
        return True  # a string literal for a `constant char*`: MSL converts it, as C++ did before 11
    if group[0][3].startswith("no matching function for call to") and any(
            kind == "note" and re.search(r"cannot convert initializer list argument to '[^']*' \(vector of", msg)
            for _, _, kind, msg in group[1:]):
        return True
    if not re.match(r"no matching constructor for initialization of|no viable overloaded '='", group[0][3]):
        return False
    spaces = [m for _, _, kind, m in group[1:] if kind == "note" and "address space" in m]
    return bool(spaces) and all(_CONSTANT_COPY.match(m) for m in spaces)


def diagnose(stderr: str) -> list[strict.Violation]:
    out: list[strict.Violation] = []
    seen_kernels: set[str] = set()
    for g in strict._groups(stderr):
        if g[0][2] != "error" or _msl_allows(g):
            continue
        msg = g[0][3]
        rule = rule_of(msg)
        if rule == "opencl" and any("address space" in m for _, _, _, m in g[1:]):
            rule = "address-space"  # e.g. no overload takes a pointer in this space
            msg += " (" + next(m for _, _, _, m in g[1:] if "address space" in m) + ")"
        if rule == "threadgroup-memory":  # report where a kernel first goes over
            kernel = re.search(r"kernel '([^']*)'", msg).group(1)
            if kernel in seen_kernels:
                continue
            seen_kernels.add(kernel)
            total = next((re.search(r"'(\d+) <= ", m) for _, _, _, m in g[1:] if "evaluates to" in m), None)
            if total:
                msg += f" ({total.group(1)} bytes)"
        text = re.sub(r"^static assertion failed(?: due to requirement '[^']*')?: \[[\w-]+\] ", "", msg)
        sources = [(f, ln) for f, ln, _, _ in g if not strict._from_headers(f) and f != "<stdin>"]
        where = sources[0] if sources else (g[0][0], g[0][1])
        v = strict.Violation(strict._short(where[0]), where[1], rule, msl_names(text))
        if v not in out:
            out.append(v)
    return out


# ------------------------------------------------------------ running clang


def _cc1() -> list[str]:
    """clang's front end proper (`clang -cc1`) from the strict pass's clang:
    no driver, no system headers; the prelude is the whole library."""
    argv = strict.find_clang().argv
    return [*argv[:2], "-cc1"] if len(argv) > 1 and argv[1] == "clang" else [argv[0], "-cc1"]


def _digest() -> str:
    h = hashlib.sha256(PRELUDE.read_bytes())
    h.update(Path(__file__).read_bytes() + Path(analysis.__file__).read_bytes())
    h.update(" ".join(_cc1() + FLAGS).encode() + strict.find_clang().version.encode())
    return h.hexdigest()


def check(text: str, version: int, cache: Path) -> list[strict.Violation]:
    """clang's OpenCL errors that MSL shares, then the analyses that read
    clang's AST (analysis.ast_rules)."""
    try:
        u = unit(text)
    except src.SourceError as e:
        raise strict.StrictError(f"the OpenCL front end cannot read this unit: {e}") from e
    key = hashlib.sha256((u.text + str(version) + _digest()).encode()).hexdigest()[:20]
    stamp = cache / f"opencl-{key}.ok"
    if stamp.exists():
        return []
    res = subprocess.run([*_cc1(), *FLAGS, "-ast-dump=json", f"-D__METAL_VERSION__={version}", "-"],
                         input=u.text, capture_output=True, text=True)
    errors = [g for g in strict._groups(res.stderr) if g[0][2] == "error"]
    found = diagnose(res.stderr)
    if res.returncode and not found and not (errors and all(_msl_allows(g) for g in errors)):
        found = [strict.Violation("<clang>", 0, "opencl", res.stderr[-2000:])]
    try:
        ast = json.loads(res.stdout) if res.stdout.strip() else None  # clang dumps it with errors too
    except ValueError:
        ast = None
    if ast is not None:
        found += [v for v in analysis.ast_rules(ast, u, version) if v not in found]
    if not found:
        stamp.touch()
    return found
