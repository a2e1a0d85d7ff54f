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
    "-__opencl_c_device_enqueue,-__opencl_c_pipes,+__cl_clang_function_pointers",
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


def _overload(candidates: list[KernelDef], args: str) -> KernelDef | None:
    """The kernel template an instantiation's arguments fit by number (as
    many as its parameters, or fewer where the rest have defaults); the
    last of several that fit."""
    n = len(src._split_top(args)) if args.strip() else 0
    fit = None
    for k in candidates:
        params = src._split_top(k.template or "")
        required = sum(1 for p in params if "=" not in p)
        if required <= n <= len(params):
            fit = k
    return fit if fit is not None else (candidates[-1] if candidates else None)


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
    and reference parameters point to (by name or through an alias, as
    float4x4 names a matrix<float, 4, 4>): clang's OpenCL mode refuses a
    kernel parameter whose pointee is a specialisation not yet instantiated."""
    out = []
    for raw in src._split_top(params):
        bare = re.sub(src._ATTR_BLOCK, " ", strict._code_only(raw))
        m = re.fullmatch(r"\s*(.*?)\s*[*&]+\s*(?:const\s*)?[A-Za-z_]\w*\s*", bare, re.S)
        if m and not re.fullmatch(r"[\s\w]*\bvoid\b[\s\w]*", m.group(1)):
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
    templates: dict[str, list[KernelDef]] = {}  # kernel templates may be overloaded (MLX's block_masked_gemm)
    for k in kernel_defs(text):
        if k.template is None:
            kernels[k.name] = (k, src.host_name(text[k.start : k.name_span[0]]) or k.name)
            edits += [(p, p, s) for p, s in _shared_memory_asserts(text, code, k.start, k.end, k.name)]
            edits.append((k.start, k.start, _complete_types(k.params)))
            continue
        templates.setdefault(k.name, []).append(k)
        head = src.template_start(code, k.start)
        edits.append((head, k.end, _blank(text, head, k.end)))
    for n, m in enumerate(src._INSTANCE_RE.finditer(code)):
        host = src.host_name(text[m.start("attrs") : m.end("attrs")])
        if host is None:
            continue
        written, args = src._template_id(text[m.start("decl") : m.end("decl")])
        k = _overload(templates.get(written.split("::")[-1], []), args)
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
                              r"\s*(?=[{;:=]|->|noexcept\b)")
_VECTOR_DECL = re.compile(
    r"(?<![\w.:>])(?:metal\s*::\s*)?((?:bool|char|uchar|short|ushort|int|uint|long|ulong|half|float|bfloat)[234])"
    r"\s+([A-Za-z_]\w*)(\s*\()"
)
_METHOD_THREAD = re.compile(r"\)(?P<quals>(?:\s*\b(?:const|volatile|thread)\b)*\s*\bthread\b(?:\s*\bconst\b)?)"
                            r"\s*(?=[{;:=]|->|noexcept\b)")


_FLOAT_LITERAL = re.compile(r"(?<![\w.])(?:(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)(?![\w.])")


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
    # passes codelets as template arguments): a reference to a function
    # here, which a template parameter binds without taking an address
    # (clang's OpenCL refuses a function's address as a template argument
    # even with its function-pointer extension; analysis.py reports function
    # pointers and references that MSL refuses).
    for m in re.finditer(r"\busing\s+\w+\s*=[^;()]*?\(\s*(\*)\s*\)\s*\(", code):
        edits.append((m.start(1), m.end(1), "&"))
    # A floating literal without a suffix is a float in MSL; clang's
    # -cl-single-precision-constant misses those in templates (MLX's FFT:
    # `0.5 * a` with `a` a vec<T, 2>), so the suffix is written out.
    for m in _FLOAT_LITERAL.finditer(code):
        edits.append((m.end(), m.end(), "f"))
    # Function constants: program-scope constants whose value the pipeline
    # sets (initialised here so that OpenCL takes them).
    for fc in src.function_constants(code):
        edits.append((fc.start, fc.end, f"__constant {fc.type} {fc.name} = {fc.type}();"))
    # A constructor's or conversion function's `thread` qualifier goes:
    # OpenCL's __private would refuse temporaries and constant evaluation,
    # which have no space there (MSL's are thread), and a conversion is
    # applied to temporaries implicitly (MLX's integral_constant products).
    # Other methods keep it (`this` private, its members private lvalues).
    scopes = src._scope_starts(code)
    for m in _METHOD_THREAD.finditer(code):
        open_paren = src._open_paren(code, m.start())
        before = code[max(0, open_paren - 200) : open_paren]
        name = re.search(r"([~\w]+)\s*$", before)
        scope = scopes[m.start()]
        owner = re.search(r".*\b(?:struct|class|union)\s+([A-Za-z_]\w*)[^;{}()]*$", code[max(0, scope - 300) : scope],
                          re.S) if scope >= 0 else None
        conversion = re.search(r"\boperator\s+[A-Za-z_][\w:<>,\s*&]*$", before)
        if not conversion and not (name and owner and name.group(1) == owner.group(1)):
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
    if re.match(r"no matching function for call to|invalid operands to binary expression", msg) and any(
            kind == "note" and re.search(r"cannot deduce a type for '\w+' that would make '(?:const )?(?:__private|thread) "
                                         r"\w+' equal '(?![^']*\b(?:__global|__local|__constant|__generic|device|"
                                         r"threadgroup|constant)\b)[^']*'", m)
            for _, _, kind, m in group[1:]):
        return True  # a temporary for a `const thread T&` template parameter: MSL's temporaries are thread
    if msg.startswith("too few elements in vector initialization"):
        return True  # `vec<float, 2> s{0}`: MSL list-initialises the rest (MLX's NAX attention)
    if msg.startswith("scalar operand type has greater rank than the type of the vector element."):
        return True  # MSL converts the scalar to the vector's elements (`0.5f * h` with h a half2)
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


_EXCESS = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+):(?:(?:\{[\d:-]+\})+:)? error: "
                     r"excess elements in scalar initializer$", re.M)
_RANK = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+):\{(?P<a>\d+:\d+-\d+:\d+)\}\{(?P<b>\d+:\d+-\d+:\d+)\}: "
                   r"error: scalar operand type has greater rank than the type of the vector element", re.M)


_VECTOR_CAST = re.compile(r"^(?P<file>.+?):\d+:\d+:\{(?P<whole>\d+:\d+-\d+:\d+)\}\{(?P<operand>\d+:\d+-\d+:\d+)\}: "
                          r"error: (?:static_cast from '[^']*' \(vector of \d+ '[^']*' values\) to '[^']*' \(vector of "
                          r"\d+ '[^']*' values\) is not allowed|(?:C-style cast )?from vector '[^']*' \(vector of \d+ "
                          r"'[^']*' values\) to vector '[^']*' \(vector of \d+ '[^']*' values\) of different size)",
                          re.M)
_TRUTH_INIT = re.compile(r"^(?P<file>.+?):\d+:\d+:\{(?P<range>\d+:\d+-\d+:\d+)\}: error: cannot initialize (?:a variable|"
                         r"return object) of type '[^']*\bbool\d' \(vector of \d 'signed char' values\) with an rvalue of "
                         r"type '[^']*' \(vector of \d '(?:int|short|long|char|signed char)' values\)", re.M)
_TRUTH_ASSIGN = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+):(?:(?:\{[\d:-]+\})+:)? error: assigning to "
                           r"'[^']*\bbool\d' \(vector of \d 'signed char' values\) from incompatible type '[^']*' "
                           r"\(vector of \d '(?:int|short|long|char|signed char)' values\)", re.M)
_POINTER_CLASS = re.compile(r"^(?P<file>.+?):\d+:\d+:\{(?P<ra>\d+:\d+-\d+:\d+)\}\{(?P<rb>\d+:\d+-\d+:\d+)\}: "
                            r"error: invalid operands to binary expression \('(?P<ta>[^']*)' and '(?P<tb>[^']*)'\)",
                            re.M)


_BOOL_VECTOR = re.compile(r"error: invalid vector element type 'bool'\n(?:(?!.*: error: ).*\n)*?"
                          r"(?P<file>[^\n]+?):(?P<line>\d+):(?P<col>\d+):(?:(?:\{[\d:-]+\})+:)? note: in instantiation of "
                          r"template type alias 'vec' requested here\n(?:(?!.*: (?:error|note): ).*\n)*"
                          r"(?:(?P<ufile>[^\n]+?):(?P<uline>\d+):(?P<ucol>\d+):(?:(?:\{[\d:-]+\})+:)? note: in "
                          r"instantiation of template type alias '(?P<alias>\w+)' requested here)?")


def _expression_end(text: str, start: int) -> int | None:
    """Where the expression from `start` ends: the first `;`, `,` or
    closing bracket outside brackets."""
    depth = 0
    for i in range(start, min(len(text), start + 2000)):
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                return i
            depth -= 1
        elif c in ";," and depth == 0:
            return i
    return None


def _comparison(expr: str) -> bool:
    """Whether an expression is, at its top level, a comparison or logical
    operation (whose vector result MSL types as a bool vector)."""
    e = expr.strip()
    while e.startswith("(") and e.endswith(")") and _expression_end(e, 1) == len(e) - 1:
        e = e[1:-1].strip()
    if e.startswith("!") and not e.startswith("!="):
        return True
    depth = 0
    for i, c in enumerate(e):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and re.match(r"==|!=|<=|>=|&&|\|\||<(?![<=])|>(?![>=])", e[i:]) and not re.match(
                r"<<|>>", e[max(0, i - 1):i + 1]):
            return True
    return False


def _line_starts(text: str) -> dict[tuple[str, int], int]:
    """(file, line) -> offset of that line in the unit, from its line markers."""
    starts: dict[tuple[str, int], int] = {}
    file, line, offset = "", 0, 0
    for raw in text.splitlines(keepends=True):
        m = re.match(r'# (\d+) "([^"]*)"', raw)
        if m:
            file, line = m.group(2), int(m.group(1))
        else:
            starts.setdefault((file, line), offset)
            line += 1
        offset += len(raw)
    return starts


def _rewrites(text: str, stderr: str) -> str:
    """What clang's OpenCL refuses in a template where MSL accepts it, found
    from clang's report (line, column and operand ranges) and rewritten in
    place, for one more run:
    * `T(a, b)` with T a dependent name that is a vector in an instantiation
      (MLX's FFT: `complex_T(x, -y)`): clang takes no constructor syntax for
      its vectors ("excess elements in scalar initializer" at T); the call
      becomes ::mh::make<T>(a, b) (for a scalar T that fails, as MSL's scalar
      constructors do);
    * a pointer and an object of a class that converts to an integer
      (`src += str_y` with str_y an MLX Int<1>): clang's OpenCL offers no
      built-in pointer arithmetic through a conversion; the object becomes
      ::mh::integral(x), its integer;
    * a vector of bool (`metal::vec<T, N>` with T bool in MLX's attention
      masks), which clang's OpenCL refuses: that use becomes
      ::mh::vec_any<T, N>, the prelude's boolN for bool (through an alias
      template, the alias's use becomes ::mh::rebind_vec);
    * a vector comparison or logical operation initialising, returned as
      or assigned to a bool vector (`bool4 b = a < c;`): clang's OpenCL
      gives a vector of integers; the operation becomes ::mh::truth(...),
      a bool vector (an integer vector that is no comparison stays an
      error, as MSL converts vectors only explicitly);
    * a cast between vectors of one width (`static_cast<float4>(i4)`,
      `(float4)s4`), which MSL converts element by element and clang's
      OpenCL refuses (or, between vectors of one size, reads as a bit
      cast, which checks the same): ::mh::convert<T>(x);
    * a scalar operand of greater rank than a vector's elements (`0.5f * v`
      with v a half2 in one instantiation): both operands pass through
      ::mh::operand, which converts a scalar beside a vector to its
      elements (the right one only of a compound assignment). Leaving the
      error would leave the function invalid for every later use."""
    starts = _line_starts(text)
    lines = [0]  # offsets of the unit's own lines (clang gives ranges in those, not the presumed ones)
    for raw in text.splitlines(keepends=True):
        lines.append(lines[-1] + len(raw))

    def at(file: str, pos: str) -> int | None:
        line, col = pos.split(":")
        base = starts.get((file, int(line)))
        return None if base is None else base + int(col) - 1

    def physical(pos: str) -> int | None:
        line, col = (int(x) for x in pos.split(":"))
        return lines[line - 1] + col - 1 if 0 < line < len(lines) else None

    edits: list[tuple[int, int, str]] = []

    def add(a: int, b: int, new: str) -> None:
        if not any(a < e1 and s1 < b or a == s1 == b == e1 for s1, e1, _ in edits):  # overlaps wait for a rerun
            edits.append((a, b, new))

    for m in _EXCESS.finditer(stderr):
        start = at(m.group("file"), f"{m.group('line')}:{m.group('col')}")
        if start is None:
            continue
        name = re.match(r"(?:typename\s+)?[A-Za-z_][\w:]*", text[start:])
        if not name:
            continue
        end = start + name.end()
        if text[end:end + 1] == "<":
            try:
                end = src._match_forward(text, end, "<>") + 1
            except src.SourceError:
                continue
        paren = re.match(r"\s*\(", text[end:])
        if paren:
            add(start, end + paren.end(), f"::mh::make<{text[start:end]}>(")
    for m in _POINTER_CLASS.finditer(stderr):
        a, b = m.group("ta"), m.group("tb")
        pointer = lambda t: t.rstrip().endswith("*") or re.search(r"\*\s*(?:const\s*)?__\w+$", t)
        arithmetic = lambda t: re.fullmatch(r"(?:\s*\b(?:const|volatile|__\w+|bool|char|short|int|long|unsigned|signed"
                                            r"|u?(?:char|short|int|long)|half|float|size_t|ptrdiff_t)\b)+\s*", t)
        if pointer(a) and not pointer(b) and not arithmetic(b):
            r = m.group("rb")
        elif pointer(b) and not pointer(a) and not arithmetic(a):
            r = m.group("ra")
        else:
            continue
        x0, x1 = (physical(x) for x in r.split("-"))
        if x0 is not None and x1 is not None:
            add(x0, x1, f"::mh::integral({text[x0:x1]})")
    for m in _BOOL_VECTOR.finditer(stderr):
        start = at(m.group("file"), f"{m.group('line')}:{m.group('col')}")
        if start is None:
            continue
        if text.startswith("vec", start):
            q = re.search(r"(?:::\s*)?\bmetal\s*::\s*$", text[max(0, start - 20):start])
            add(start - (len(q.group(0)) if q else 0), start + 3, "::mh::vec_any")
            continue
        # vec in an alias template (`template <class U> using dtype_frag_t =
        # metal::vec<U, N>`, which calls deduce through): the alias stays,
        # and its use for bool becomes ::mh::rebind_vec<alias<float>, bool>.
        use = at(m.group("ufile"), f"{m.group('uline')}:{m.group('ucol')}") if m.group("alias") else None
        if use is None or not text.startswith(m.group("alias"), use):
            continue
        end = use + len(m.group("alias"))
        if text[end:end + 1] != "<":
            continue
        try:
            close = src._match_forward(text, end, "<>")
        except src.SourceError:
            continue
        args = text[end + 1:close]
        if len(src._split_top(args)) != 1:
            continue
        head = re.search(r"(?:\btypename\s+)?(?:[\w:]+\s*::\s*(?:template\s+)?)*$", text[max(0, use - 200):use])
        qualified = head.group(0) if head else ""
        scope = re.sub(r"^typename\s+", "", qualified)
        name = "typename " + scope if "::" in scope else scope
        add(use - len(qualified), close + 1,
            f"::mh::rebind_vec<{name}{m.group('alias')}<float>, {args}>")
    for m in _TRUTH_INIT.finditer(stderr):
        a, b = (physical(x) for x in m.group("range").split("-"))
        if a is not None and b is not None and _comparison(text[a:b]):
            add(a, b, f"::mh::truth({text[a:b]})")
    for m in _TRUTH_ASSIGN.finditer(stderr):
        eq = at(m.group("file"), f"{m.group('line')}:{m.group('col')}")
        if eq is None or text[eq:eq + 1] != "=":
            continue
        end = _expression_end(text, eq + 1)
        if end is not None and _comparison(text[eq + 1:end]):
            add(eq + 1, end, f" ::mh::truth({text[eq + 1:end].strip()})")
    for m in _VECTOR_CAST.finditer(stderr):
        (a0, a1), (b0, b1) = ((physical(x) for x in r.split("-")) for r in (m.group("whole"), m.group("operand")))
        if None in (a0, a1, b0, b1):
            continue
        head, operand = text[a0:b0], text[b0:b1]
        cast = re.match(r"\s*static_cast\s*<(.*)>\s*\(\s*$", head, re.S)
        if cast:
            kind = cast.group(1)
        elif re.fullmatch(r"\s*\((.*)\)\s*", head, re.S):
            kind = re.fullmatch(r"\s*\((.*)\)\s*", head, re.S).group(1)
        elif head.rstrip().endswith("("):
            kind = head.rstrip()[:-1]
        else:
            continue
        tail = text[b1:a1]
        if tail.strip() not in ("", ")"):
            continue
        add(a0, a1, f"::mh::convert<{kind}>({operand})")
    for m in _RANK.finditer(stderr):
        spans = []
        for r in (m.group("a"), m.group("b")):
            a, b = (physical(x) for x in r.split("-"))
            if a is None or b is None:
                break
            spans.append((a, b))
        if len(spans) != 2:
            continue
        (a0, a1), (b0, b1) = spans
        op = text[a1:b0].strip()
        lhs, rhs = text[a0:a1], text[b0:b1]
        if op.endswith("=") and op not in ("==", "!=", "<=", ">="):
            add(b0, b1, f"::mh::operand<decltype({lhs})>({rhs})")
        else:
            add(a0, b1, f"::mh::operand<decltype({rhs})>({lhs}) {op} ::mh::operand<decltype({lhs})>({rhs})")
    return _edit(text, edits) if edits else text


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
    run = lambda t: subprocess.run([*_cc1(), *FLAGS, "-fdiagnostics-print-source-range-info", "-ast-dump=json",
                                    f"-D__METAL_VERSION__={version}", "-"], input=t, capture_output=True, text=True)
    res = run(u.text)
    for _ in range(3):
        fixed = _rewrites(u.text, res.stderr)
        if fixed == u.text:
            break
        u = Unit(fixed, u.kernels)
        res = run(u.text)
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
