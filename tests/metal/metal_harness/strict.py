"""The strict pass: what Apple's Metal compiler rejects, rejected before a
source is built for the executor.

Checks in order (``violations``), each failing with
``<file>.metal:<line>: [rule] message``:

* a source scan of the preprocessed translation unit (project headers
  expanded, MSL headers empty) for MSL's C++ subset, kernel parameters and
  features above the file's language version;
* a second front end, clang (>= 15, for ``_Float16``) with ``-fsyntax-only``,
  the shim force-included and ``device`` / ``constant`` / ``threadgroup``
  mapped to distinct ``address_space(N)`` qualifiers (``thread`` is the
  default space): a pointer or reference passed or assigned into another
  space does not compile (run twice, for class objects: see clang_check);
* the shim's own compile-time checks (``mh/tensor.h``: the MetalPerformance-
  Primitives constraints);
* a third front end, clang in C++-for-OpenCL mode (opencl.py), whose kernel
  language shares most of MSL's rules;
* the pass's own analyses (analysis.py): resource indices and limits,
  built-in inputs, recursion, uniform control flow of barriers and simd
  functions.

The language version of a file is the ``-std`` the CMake build gives it:
files named ``tensorops_*`` compile at ``LATTICE_TENSOROPS_STD``, all others
at ``LATTICE_METAL_STD`` (both read from CMakeLists.txt), and
``__METAL_VERSION__`` is set to match.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import source as src

HERE = Path(__file__).resolve().parent
INCLUDE = HERE / "include"
ROOT = HERE.parents[2]
CMAKELISTS = ROOT / "CMakeLists.txt"

TENSOROPS_PREFIX = "tensorops_"


class StrictError(Exception):
    """A source uses something Apple's Metal compiler rejects."""


@dataclass(frozen=True)
class Violation:
    file: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: [{self.rule}] {self.message}"


# ------------------------------------------------------------ language versions


def _std_number(value: str, name: str) -> int:
    m = re.fullmatch(r"metal(\d+)\.(\d+)", value)
    if not m:
        raise StrictError(f"{CMAKELISTS.name}: {name} is '{value}', expected metalX.Y")
    return int(m.group(1)) * 100 + int(m.group(2)) * 10


def language_versions(cmake: Path = CMAKELISTS) -> dict[str, int]:
    """{'metal': 310, 'tensorops': 400} from the two set() lines of the build."""
    text = cmake.read_text()
    out = {}
    for key, name in (("metal", "LATTICE_METAL_STD"), ("tensorops", "LATTICE_TENSOROPS_STD")):
        found = re.findall(rf"^\s*set\(\s*{name}\s+(\S+?)\s*\)", text, re.M)
        if len(found) != 1:
            raise StrictError(
                f"{cmake}: expected exactly one 'set({name} metalX.Y)' line, found {len(found)}"
            )
        out[key] = _std_number(found[0], name)
    return out


def version_for(path: Path) -> int:
    """__METAL_VERSION__ of a source: the -std its metallib is built with."""
    versions = language_versions()
    return versions["tensorops" if path.name.startswith(TENSOROPS_PREFIX) else "metal"]


def version_text(v: int) -> str:
    return f"Metal {v // 100}.{v % 100 // 10}"


# ------------------------------------------------------------ locations


class Locator:
    """Maps offsets of a preprocessed text to (file, line) via line markers."""

    _MARK = re.compile(r'^# (\d+) "([^"]*)"((?: \d)*)$', re.M)

    def __init__(self, text: str):
        self.text = text
        self.marks = [(m.end(), int(m.group(1)), m.group(2)) for m in self._MARK.finditer(text)]
        self.starts = [e for e, _, _ in self.marks]

    def __call__(self, pos: int) -> tuple[str, int]:
        i = bisect.bisect_right(self.starts, pos) - 1
        if i < 0:
            return "<input>", self.text.count("\n", 0, pos) + 1
        end, line, file = self.marks[i]
        # The marker names the line after its own newline.
        return file, line + self.text.count("\n", end + 1, pos)


def _short(file: str) -> str:
    p = Path(file)
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return file


# ------------------------------------------------------------ source scan

# MSL's C++ subset: the specification's list of C++ features Metal does not
# support, and its scalar types (no double, long double or long long). The
# list holds for every version these files use, except that function
# pointers (2.3) and some recursion (2.4) became legal: neither is checked.
_SUBSET = [
    ("double", r"\bdouble\b", "MSL has no double (nor long double): use float"),
    ("long-long", r"\blong\s+long\b", "MSL has no long long: use long (64 bits in MSL)"),
    ("goto", r"\bgoto\b", "MSL does not support goto"),
    ("virtual", r"\bvirtual\b", "MSL does not support virtual functions"),
    ("exceptions", r"\btry\s*\{|\bcatch\s*\(|\bthrow\b", "MSL does not support exceptions (try, catch, throw)"),
    ("new-delete", r"\b(?:new|delete)\b", "MSL does not support new and delete"),
    ("thread_local", r"\bthread_local\b", "MSL does not support thread_local storage"),
    ("register", r"\bregister\b(?!_)", "MSL does not support the register storage class"),
    ("dynamic_cast", r"\bdynamic_cast\b", "MSL does not support dynamic_cast"),
    ("typeid", r"\btypeid\b", "MSL does not support type identification (typeid)"),
    ("noexcept", r"\bnoexcept\s*\(", "MSL does not support the noexcept operator"),
    ("std", r"\bstd\s*::", "the C++ standard library is not available in MSL (std::)"),
]
_SUBSET_RE = [(rule, re.compile(rx), msg) for rule, rx, msg in _SUBSET]

# Features newer than a language version: (rule, regex, version, message).
_VERSIONED = [
    ("version", r"\batomic_float\b", 300, "atomic_float needs Metal 3.0"),
    ("version", r"\bbfloat(?:[234])?\b", 310, "bfloat needs Metal 3.1"),
    ("lambda", r"(?:[=(,{;?:]|\breturn)\s*\[[^\[\]]*\]\s*(?:\(|\{|mutable\b)", 400,
     "MSL does not support lambda expressions before Metal 4.0 (MSL 4 is based on C++17; MLX's NAX kernels use them)"),
    ("version", r"\bmpp\s*::|\bcooperative_tensor\b|\bexecution_simdgroups?\b|\btensor_inline\b|\bdextents\b",
     400, "tensors and tensor operations need Metal 4.0"),
]
_VERSIONED_RE = [(rule, re.compile(rx), v, msg) for rule, rx, v, msg in _VERSIONED]
_VERSIONED_HEADERS = {
    "metal_logging": 320,
    "metal_tensor": 400,
    "MetalPerformancePrimitives.h": 400,
}

_ADDRESS_SPACES = ("device", "constant", "threadgroup", "thread", "threadgroup_imageblock", "ray_data", "object_data")


def _code_only(text: str) -> str:
    """Literals and line markers blanked, newlines kept."""
    masked = src._mask_literals(text)
    return re.sub(r"^#.*$", lambda m: " " * len(m.group(0)), masked, flags=re.M)


def scan_rules(text: str, version: int) -> list[Violation]:
    """MSL C++-subset, version and kernel-parameter rules on a preprocessed unit."""
    at = Locator(text)
    code = _code_only(text)
    found: list[Violation] = []

    def add(pos: int, rule: str, msg: str) -> None:
        f, ln = at(pos)
        if not f.startswith("/usr/"):  # the include itself is reported
            found.append(Violation(_short(f), ln, rule, msg))

    for rule, rx, msg in _SUBSET_RE:
        for m in rx.finditer(code):
            if m.group(0) == "delete" and code[: m.start()].rstrip().endswith("="):
                continue  # `= delete`: a deleted function, not the operator
            add(m.start(), rule, msg)

    # Headers: the standard library, and MSL headers above the version.
    include = str(INCLUDE)
    current = "<built-in>"
    for m in Locator._MARK.finditer(text):
        prev = m.start()  # where the #include line was
        file, flags = m.group(2), m.group(3).split()
        from_source = not current.startswith("<") and not current.startswith("/usr/")
        if "1" in flags and from_source:  # a source (not a system header) includes
            name = Path(file).name
            if file.startswith("/usr/") and not file.startswith(include):
                add(prev, "std", f"the C++ standard library is not available in MSL (#include <{name}>)")
            need = _VERSIONED_HEADERS.get(name)
            if need and file.startswith(include) and version < need:
                add(prev, "version", f"<{name}> needs {version_text(need)}; this file compiles as {version_text(version)}")
        current = file

    for rule, rx, need, msg in _VERSIONED_RE:
        if version < need:
            for m in rx.finditer(code):
                add(m.start(), rule, f"{msg}; this file compiles as {version_text(version)}" if rule == "version"
                    else msg)

    found += _kernel_parameter_rules(text, code, at)
    return sorted(set(found), key=lambda v: (v.file, v.line, v.rule))


def _kernel_parameter_rules(text: str, code: str, at: Locator) -> list[Violation]:
    """A kernel's pointer and reference parameters name their address space."""
    out = []
    for m in src._KERNEL_RE.finditer(code):
        pre = m.group("pre")
        items = src._attr_items(pre)
        if not (re.search(r"\bkernel\b", re.sub(src._ATTR_BLOCK, " ", pre)) or any(k == "kernel" for k, _ in items)):
            continue
        open_paren = m.end() - 1
        close = src._match_forward(code, open_paren)
        pos = open_paren + 1
        for raw in src._split_top(code[open_paren + 1 : close]):
            bare = re.sub(src._ATTR_BLOCK, " ", raw)
            if ("*" in bare or "&" in bare) and not re.search(
                r"\b(?:" + "|".join(_ADDRESS_SPACES) + r")\b", bare
            ):
                offset = pos + len(raw) - len(raw.lstrip())
                f, ln = at(offset)
                decl = " ".join(raw.split())
                out.append(Violation(
                    _short(f), ln, "address-space",
                    f"kernel parameter '{decl}' is a pointer or reference without an address space "
                    "(device, constant or threadgroup)",
                ))
            pos += len(raw) + 1
    return out


# ------------------------------------------------------------ clang front end

# Element types that keep their address space in every clang pass: scalars,
# atomics and template parameters (T, TI; the kernels here instantiate them
# with scalars, so a vector there would fail this pass wrongly). Class types
# (vectors, structs, tensors) keep it only in the second pass: clang's C++
# mode has no member functions, copy constructors or operators for objects
# in a named space, so copying a `device float4` or adding a `constant`
# one fails there while Metal accepts it.
_SCALARS = {
    "bool", "char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "half", "float",
    "bfloat", "size_t", "int8_t", "uint8_t", "int16_t", "uint16_t", "int32_t", "uint32_t",
    "int64_t", "uint64_t", "unsigned", "signed", "void", "bfloat16_t", "float16_t", "float32_t",
}
_ATOMICS = {"atomic_int", "atomic_uint", "atomic_float", "atomic_bool", "atomic_long", "atomic_ulong"}
_SPACE_WORD = re.compile(r"\b(device|constant|threadgroup)\b(?!_)")
_TEMPLATE_PARAM = re.compile(r"^[A-Z][A-Z0-9_]{0,3}$")


def _element_kind(code: str, end: int) -> str:
    """'scalar', 'atomic' or 'class' for the type after an address-space word."""
    m = re.match(r"\s*(?:(?:const|volatile|constexpr|static|inline)\s+)*((?:metal\s*::\s*)?[A-Za-z_]\w*)",
                 code[end : end + 200])
    if not m:
        return "scalar"
    name = m.group(1).split("::")[-1].strip()
    if name in _SCALARS or _TEMPLATE_PARAM.match(name):
        return "scalar"
    return "atomic" if name in _ATOMICS else "class"


def _points(code: str, end: int) -> bool:
    """Whether the type after an address-space word at `end` is a pointer or
    reference (`device const complex64_t* p`, `thread Tile<T, 2>& t`)."""
    m = re.match(r"\s*(?:(?:const|volatile)\s+)*(?:::\s*)?[A-Za-z_]\w*(?:\s*::\s*[A-Za-z_]\w*)*\s*", code[end : end + 400])
    if not m:
        return False
    i = end + m.end()
    if i < len(code) and code[i] == "<":
        try:
            i = src._match_forward(code, i, "<>") + 1
        except src.SourceError:
            return False
    rest = re.match(r"(?:\s*(?:const|volatile)\b)*\s*(.)", code[i : i + 80])
    return bool(rest) and rest.group(1) in "*&"


def clang_unit(text: str, class_spaces: bool = False) -> str:
    """The scanned text rewritten for the address-space front end; with
    `class_spaces`, objects of class type keep their space too (except
    threadgroup variables, which clang cannot construct in one)."""
    code = _code_only(text)
    edits: list[tuple[int, int, str]] = []
    for m in re.finditer(r"\[\[\s*threadgroup\s*\(", code):
        edits.append((m.start(), m.end(), "[[mh_threadgroup("))
    # Shared-memory variables: static storage in the threadgroup space.
    tg_decl = {d.start for d in src.threadgroup_decls(text, src._mask_literals(text), lenient=True)}
    for s in tg_decl:
        edits.append((s, s, "static "))
    attr_spans = [(m.start(), m.end()) for m in re.finditer(src._ATTR_BLOCK, code)]
    for m in _SPACE_WORD.finditer(code):
        if any(a <= m.start() < b for a, b in attr_spans):
            continue
        # The first run drops every space (C++'s type rules alone); the
        # second keeps them all and counts only what moves a pointer or
        # reference between spaces (and MSL's own space rules).
        drop = not class_spaces
        if drop:
            # A constant pointer or reference is to const (binding a `const
            # constant int` to a `constant int&`); a constant variable's
            # initialisation is the OpenCL front end's to check.
            word = m.group(1) if m.group(1) != "constant" or _points(code, m.end()) else "object"
            edits.append((m.start(), m.end(), f"mh_class_{word}"))
    # An array parameter in a space (`constant const int64_t strides[2]`):
    # clang's C++ mode refuses the qualified array type that OpenCL and MSL
    # adjust to a pointer; spelled as that pointer here.
    for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\[[^\[\]]*\]\s*(?=[,)])", code):
        decl = re.search(r"[(,]([\s\w:]*)$", code[max(0, m.start() - 200) : m.start()])
        if decl and _SPACE_WORD.search(decl.group(1)) and re.search(r"\w\s+$", decl.group(1)):
            edits.append((m.start(), m.end(), f"*{m.group(1)}"))
    # Function constants: values the pipeline sets, not constant expressions.
    replaced: list[tuple[int, int, str]] = []
    for fc in src.function_constants(code):
        replaced.append((fc.start, fc.end,
                         f'static const ::mh::FunctionConstant<{fc.type}, {fc.index}> {fc.name}{{"{fc.name}"}};'))
    for m in src._INSTANCE_RE.finditer(code):  # clang takes no attributes there
        edits.append((m.start("attrs"), m.end("attrs"), " "))
        # An instantiation that spells the parameters is named by decltype
        # instead: its parameters' spaces were rewritten here as written,
        # the template's were not (a template parameter keeps its space).
        decl = text[m.start("decl") : m.end("decl")]
        if "(" in decl and not decl.lstrip().startswith("decltype"):
            written, args = src._template_id(decl)
            replaced.append((m.start("decl"), m.end("decl"),
                             f"decltype({written}<{args}>) {written}<{args}>" + "\n" * decl.count("\n")))
    for m in src._HALF_LITERAL_RE.finditer(code):
        edits.append((m.start(), m.end(), f"((half)({m.group(1)}))"))
    for m in re.finditer(r'^# (\d+) "([^"]*)"((?: \d)+)$', text, re.M):
        edits.append((m.start(3), m.end(3), ""))
    edits = [e for e in edits if not any(a <= e[0] < b for a, b, _ in replaced)] + replaced
    out = src.apply_edits(text, edits)
    # clang's C++ mode has no address-space method qualifiers, and here class
    # objects' spaces may be gone: functions overloaded on those alone become
    # one (the OpenCL front end, which keeps both, checks the calls).
    erased = {"mh_class_device", "mh_class_constant", "mh_class_threadgroup"}
    masked = src._mask_literals(out)
    return src.apply_edits(out, src.space_overload_edits(out, masked, erased, strip_methods=True)
                           + src.space_specialization_edits(out, masked, erased))


_CLANG_CANDIDATES = ("clang++-22", "clang++-21", "clang++-20", "clang++-19", "clang++-18", "clang++-17",
                     "clang++-16", "clang++-15", "clang++")

# The clang the test extra installs: the one in the `ziglang` wheel (clang
# 22 for ziglang 0.17), run as a bare front end (`zig clang`, not `zig c++`,
# which would first build a C++ runtime for the host). It parses against the
# headers the wheel carries (libc++, musl, clang's builtins) for one fixed
# target, so the pass reads the same headers on every host: Linux x86_64
# and aarch64, macOS. Syntax only, so the target never has to run.
_ZIG_TARGET = "x86_64-linux-musl"
_ZIG_LIBCXX_DEFINES = (
    "_LIBCPP_ABI_VERSION=1", "_LIBCPP_ABI_NAMESPACE=__1", "_LIBCPP_HAS_THREADS=1",
    "_LIBCPP_HAS_MONOTONIC_CLOCK", "_LIBCPP_HAS_TERMINAL", "_LIBCPP_HAS_MUSL_LIBC=1",
    "_LIBCPP_DISABLE_VISIBILITY_ANNOTATIONS", "_LIBCXXABI_DISABLE_VISIBILITY_ANNOTATIONS",
    "_LIBCPP_HAS_VENDOR_AVAILABILITY_ANNOTATIONS=0", "_LIBCPP_HAS_FILESYSTEM=1",
    "_LIBCPP_HAS_RANDOM_DEVICE", "_LIBCPP_HAS_LOCALIZATION", "_LIBCPP_HAS_UNICODE",
    "_LIBCPP_HAS_WIDE_CHARACTERS", "_LIBCPP_HAS_NO_STD_MODULES", "_LIBCPP_HAS_TIME_ZONE_DATABASE",
    "_LIBCPP_PSTL_BACKEND_SERIAL", "_LIBCPP_HARDENING_MODE=_LIBCPP_HARDENING_MODE_NONE",
    "_LIBCPP_ASSERTION_SEMANTIC_DEFAULT=_LIBCPP_ASSERTION_SEMANTIC_IGNORE",
)


@dataclass(frozen=True)
class Clang:
    """A clang front end: the command line that starts it (before the
    strict flags), its version line, and the header roots it brings, whose
    diagnostics are reported at the .metal line that led to them."""

    argv: tuple[str, ...]
    version: str
    header_roots: tuple[str, ...] = ("/usr/",)


def _version_of(argv: list[str]) -> tuple[int, str] | None:
    try:
        proc = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    # (a front end that fails is no candidate, whatever it printed)
    m = re.search(r"clang version (\d+)", proc.stdout) if proc.returncode == 0 else None
    return (int(m.group(1)), proc.stdout.splitlines()[0]) if m else None


def _zig_clang() -> Clang | None:
    """The test extra's clang, or None where the ziglang wheel is absent."""
    import importlib.util

    spec = importlib.util.find_spec("ziglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    pkg = Path(next(iter(spec.submodule_search_locations)))
    exe = next((p for p in (pkg / "zig", pkg / "zig.exe") if p.is_file()), None)
    lib = pkg / "lib"
    found = _version_of([str(exe), "clang"]) if exe else None
    if not found or found[0] < 15:
        return None
    libc = lib / "libc" / "include"
    dirs = [lib / "libcxx" / "include", lib / "libcxxabi" / "include", lib / "include",
            libc / _ZIG_TARGET, libc / "generic-musl", libc / "x86-linux-any", libc / "any-linux-any"]
    argv = [str(exe), "clang", "-target", _ZIG_TARGET, "-nostdinc", "-nostdinc++"]
    for d in dirs:
        argv += ["-isystem", str(d)]
    argv += [f"-D{d}" for d in _ZIG_LIBCXX_DEFINES]
    # libc++'s <utility> brings in <cmath> for older code, and its <math.h>
    # declares float overloads (sqrt, floor, fma) in the global namespace
    # that collide with the shim's metal:: ones; MSL has no global maths.
    argv.append("-D_LIBCPP_REMOVE_TRANSITIVE_INCLUDES")
    return Clang(tuple(argv), f"{found[1]} (ziglang, {_ZIG_TARGET} headers)", (str(lib) + os.sep,))


_found_clang: dict[str | None, Clang] = {}


def _clang() -> Clang:
    """The front end: MLX_LATTICE_HARNESS_CLANG where set (a clang++ command
    or path), else the test extra's clang (ziglang), else a system clang++ >=
    15; StrictError saying how to get one where there is none."""
    env = os.environ.get("MLX_LATTICE_HARNESS_CLANG")
    if env in _found_clang:
        return _found_clang[env]
    found = None if env else _zig_clang()
    for name in ([env] if env else _CLANG_CANDIDATES if found is None else ()):
        exe = shutil.which(name)
        version = _version_of([exe]) if exe else None
        if version and version[0] >= 15:
            found = Clang((exe,), version[1])
            break
    if found is None:
        raise StrictError(
            "the strict Metal pass needs clang >= 15 (address spaces as types, _Float16 on x86): "
            'install the test extra (pip install -e ".[test]", which brings clang in the ziglang '
            "wheel), or a system clang++ (Debian: apt-get install -y clang-16), or set "
            "MLX_LATTICE_HARNESS_CLANG"
        )
    _found_clang[env] = found
    return found


def find_clang() -> Clang:
    return _clang()


def _from_headers(file: str) -> bool:
    """A diagnostic inside the shim or a standard header, not a .metal source."""
    return file.startswith(str(INCLUDE)) or any(file.startswith(r) for r in _clang().header_roots)


CLANG_FLAGS = [
    "-x", "c++", "-std=c++20", "-fsyntax-only", "-ferror-limit=0", "-fno-color-diagnostics",
    "-w",  # MSL attributes are unknown to clang; only errors matter
    "-cl-single-precision-constant",  # MSL has no double: unsuffixed floating literals are float
    "-fno-elide-type",  # full types in messages: their address spaces decide what counts
    f"-I{INCLUDE}", "-include", "mh/strict.h", "-DMLX_LATTICE_HARNESS=1", "-D__METAL__=1",
]

_DIAG = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?:\d+:)?(?:(?:\{[\d:-]+\})+:)? (?P<kind>error|note|warning): "
                   r"(?P<msg>.*)$", re.M)


_SPACE_NAMES = {"1": "device", "2": "constant", "3": "threadgroup"}


def _space_names(msg: str) -> str:
    msg = re.sub(r"__attribute__\(\(address_space\((\d)\)\)\)", lambda m: _SPACE_NAMES.get(m.group(1), m.group(0)), msg)
    return re.sub(r"address space '(\d)'", lambda m: f"address space '{_SPACE_NAMES.get(m.group(1), m.group(1))}'", msg)


def _mentions_space(msg: str) -> bool:
    msg = _space_names(msg)
    return "address space" in msg or bool(re.search(r"'(?:const )?(?:device|constant|threadgroup) ", msg))


# clang's messages -> the MSL rule they enforce (both front ends).
MESSAGE_RULES = [
    ("program-scope", r"program scope variable must reside in constant address space"
                      r"|static local variable must reside in constant address space"),
    ("constant-init", r"variable in constant address space must be initialized"),
    ("read-only", r"read-only variable is not assignable|cannot assign to variable .* with const-qualified type"
                  r"|cannot assign to return value because .* const-qualified"),
    ("threadgroup-scope", r"non-kernel function variable cannot be declared in local address space"
                          r"|variables in the local address space can only be declared in the outermost scope"),
    ("threadgroup-init", r"'__local' variable cannot have an initializer"),
    ("function-pointer", r"pointers to functions are not allowed|references to functions are not allowed"),
    ("variadic", r"variadic arguments are not allowed"),
    ("kernel-signature", r"kernel must have void return type|cannot be used as the type of a kernel parameter"
                         r"|kernel functions cannot be|conflicting types for"),
    ("double", r"use of type '(?:long )?double' requires"),
    ("virtual", r"virtual functions are not supported"),
    ("address-space", r"address space|function scope variable cannot be declared in global address space"),
]


def _rule_of(msg: str) -> tuple[str, str]:
    tag = re.match(r"(?:static assertion failed(?: due to requirement '[^']*')?: )?\[([\w-]+)\] (.*)", msg)
    if tag:
        return tag.group(1), _space_names(tag.group(2))
    msg = _space_names(msg)
    rule = next((r for r, rx in MESSAGE_RULES if re.search(rx, msg)), None)
    if rule:
        return rule, msg
    if re.search(r"\b(device|constant|threadgroup)\b", msg):
        return "address-space", msg
    return "compile", msg


# What the second pass (class objects in their spaces) reports: a pointer
# or reference moved between spaces. Everything else there is clang's C++
# mode refusing class-object copies, operators and methods that MSL allows.
_SPACE_MISMATCH = re.compile(
    r"candidate function.* not viable: cannot (?:pass pointer|bind reference)"
    r"|no known conversion from '[^']*[*\]]' to '[^']*\*'"
    r"|cannot initialize a (?:variable|parameter|member subobject) of type '[^']*[*&]' with an? [lr]value of type '[^']*[*\]]'"
    r"|assigning to '[^']*\*' from .*'[^']*\*'"
    r"|changes address space"
)


# What the second run counts besides pointers and references moved between
# spaces: the shim's tagged checks that read spaces (tensor operands) and
# MSL's rules on where a space may be written.
_SECOND_RUN_RULES = re.compile(
    r"^(?:static assertion failed(?: due to requirement '[^']*')?: )?\[[\w-]+\] "
    r"|automatic variable qualified with an address space"
)


def _counted_in_second_run(group: list[tuple[str, int, str, str]]) -> bool:
    return _space_mismatch(group) or bool(_SECOND_RUN_RULES.search(group[0][3]))


def _space_mismatch(group: list[tuple[str, int, str, str]]) -> bool:
    for file, _, _, msg in group:
        msg = _space_names(msg)
        if "generic address space" in msg and file.startswith(str(INCLUDE)):
            continue  # a shim operator or method on a class object
        if re.search(r"\(the implicit (?:copy|move) (?:constructor|assignment operator)\)", msg):
            continue  # MSL copies class objects between spaces
        if _SPACE_MISMATCH.search(msg) and _mentions_space(msg):
            return True
    return False


def _struct_lines(header: Path, name: str) -> tuple[str, range]:
    """(path, line range) of `struct name { ... };` in a shim header."""
    lines = header.read_text().splitlines()
    start = next(i for i, t in enumerate(lines, 1) if t.startswith(f"struct {name} {{"))
    end = next(i for i, t in enumerate(lines[start:], start + 1) if t.startswith("};"))
    return str(header), range(start, end + 1)


_BFLOAT = _struct_lines(INCLUDE / "mh" / "types.h", "bfloat")


def _bfloat_in_space(group: list[tuple[str, int, str, str]]) -> bool:
    """An error only because the shim's bfloat, a scalar in MSL, is a class
    here: a conversion or assignment of a bfloat in device, constant or
    threadgroup memory (a `device T*` with T = bfloat keeps its space in the
    first pass, as template parameters do), which Metal accepts. Pointers and
    references moved between spaces raise other notes and still count."""
    notes = [(f, ln, msg) for f, ln, _, msg in group[1:] if _mentions_space(msg)]
    return bool(notes) and all(
        f == _BFLOAT[0] and ln in _BFLOAT[1] and "generic address space" in msg for f, ln, msg in notes
    )


_IMPLICIT_COPY = re.compile(
    r"candidate (?:constructor|function) \(the implicit (?:copy|move) (?:constructor|assignment operator)\) not viable:"
)


def _class_copy(group: list[tuple[str, int, str, str]]) -> bool:
    """An error only because clang's C++ mode cannot copy a class object out
    of (or into) a named space, which MSL does: a construction or assignment
    whose implicit copy or move member is refused for the object's space
    alone (a template parameter instantiated with a class keeps its space
    in the first run)."""
    if not re.match(r"no matching constructor for initialization of|no viable overloaded '='", group[0][3]):
        return False
    return any(kind == "note" and _IMPLICIT_COPY.match(msg) and (
        "cannot bind reference in address space" in msg or re.search(r"'this' object is in address space", msg))
        for _, _, kind, msg in group[1:])


_LITERAL_TO_CONSTANT = re.compile(
    r"from 'const char \[\d+\]' to '(?:const )?constant char \*'|from 'const char\[\d+\]' to '(?:const )?constant char \*'"
    r"|of type '(?:const )?constant char \*' with an lvalue of type 'const char ?\[\d+\]'"
)


def _string_literal(group: list[tuple[str, int, str, str]]) -> bool:
    """An error only because a string literal, a `constant char` array in
    MSL, is in the default space in clang's C++ mode (passed for a
    `constant char*`); the OpenCL front end, whose literals are constant,
    checks the call."""
    return any(_LITERAL_TO_CONSTANT.search(_space_names(msg)) for _, _, _, msg in group)


_OBJECT_IN_SPACE = re.compile(r"'(?:const )?(?:device|constant|threadgroup) (?:const )?([^'*&]+?)(?: const)?(?:\[\d*\])?'")
# Scalars in MSL and in the shim (bfloat is a class here).
_SCALAR_TYPES = re.compile(r"(?:metal::)?(?:" + "|".join(sorted(_SCALARS - {"bfloat", "bfloat16_t"}))
                           + r"|_Float16|unsigned (?:int|char|short|long))"
                           r"(?: __attribute__\(\(ext_vector_type\(\d+\)\)\))?$")


def _same_class_operands(group: list[tuple[str, int, str, str]]) -> bool:
    """`c ? a : b` with a and b of one class type but for cv and address
    space, which clang's C++ mode cannot reconcile (MSL converts)."""
    m = re.match(r"incompatible operand types \('([^']*)'(?: \(aka '([^']*)'\))? and '([^']*)'(?: \(aka '([^']*)'\))?\)",
                 _space_names(group[0][3]))
    if not m:
        return False
    strip = lambda t: " ".join(w for w in (t or "").split() if w not in ("const", "device", "constant", "threadgroup"))
    a, b = strip(m.group(2) or m.group(1)), strip(m.group(4) or m.group(3))
    return a == b and not _SCALAR_TYPES.match(a) and "*" not in a and "&" not in a


def _class_object_in_space(group: list[tuple[str, int, str, str]]) -> bool:
    """Whether an error concerns a class object (not a pointer or reference)
    in a named space: a template parameter instantiated with a class
    (bfloat, complex_t) keeps its space in the first run, where clang's C++
    mode has no constructors, operators or methods for such objects. Such
    errors count as in the second run: only when a pointer or reference
    moves between spaces."""
    if _same_class_operands(group):
        return True
    for _, _, _, msg in group:
        for m in _OBJECT_IN_SPACE.finditer(_space_names(msg)):
            if not _SCALAR_TYPES.match(m.group(1).strip()):
                return True
    return False


def _groups(stderr: str) -> list[list[tuple[str, int, str, str]]]:
    """clang's diagnostics, one group per error with the notes after it."""
    groups: list[list[tuple[str, int, str, str]]] = []
    for m in _DIAG.finditer(stderr):
        d = (m.group("file"), int(m.group("line")), m.group("kind"), m.group("msg"))
        if d[2] == "error" or not groups:
            groups.append([d])
        else:
            groups[-1].append(d)
    return groups


def diagnose(stderr: str, mismatch_only: bool = False) -> list[Violation]:
    """clang errors as violations at the innermost .metal line that led to
    them (clang prints an error, then its instantiation notes); with
    `mismatch_only`, only pointers and references moved between spaces."""
    out = []
    for g in _groups(stderr):
        if g[0][2] != "error" or (mismatch_only and not _counted_in_second_run(g)) or _bfloat_in_space(g) \
                or _class_copy(g) or _string_literal(g) or (_class_object_in_space(g) and not _space_mismatch(g)):
            continue
        sources = [(f, ln) for f, ln, _, _ in g if not _from_headers(f)]
        where = sources[0] if sources else (g[0][0], g[0][1])
        rule, text = _rule_of(g[0][3])
        if (mismatch_only and _space_mismatch(g)) or (
                rule == "compile" and any(_mentions_space(msg) for _, _, _, msg in g[1:])):
            note = next((msg for _, _, _, msg in g[1:] if _mentions_space(msg)), None)
            rule, text = "address-space", f"{text} ({_space_names(note)})" if note else _space_names(text)
        v = Violation(_short(where[0]), where[1], rule, text)
        if v not in out:
            out.append(v)
    return out


def clang_check(text: str, version: int, cache: Path) -> list[Violation]:
    """Address spaces (and the shim's static checks) through clang, in two
    passes: class objects without their spaces (every error counts), then
    with them (only pointers and references moved between spaces count)."""
    clang = _clang()
    units = [clang_unit(text), clang_unit(text, class_spaces=True)]
    key = hashlib.sha256(
        ("".join(units) + str(version) + " ".join(clang.argv) + clang.version + " ".join(CLANG_FLAGS)
         + _shim_digest()).encode()
    ).hexdigest()[:20]
    stamp = cache / f"strict-{key}.ok"
    if stamp.exists():
        return []
    for second, unit in enumerate(units):
        res = subprocess.run(
            [*clang.argv, *CLANG_FLAGS, f"-D__METAL_VERSION__={version}", "-"],
            input=unit, capture_output=True, text=True,
        )
        if res.returncode == 0:
            continue
        found = diagnose(res.stderr, mismatch_only=bool(second))
        errors = [g for g in _groups(res.stderr) if g[0][2] == "error"]
        if not found and errors and all(_bfloat_in_space(g) or _class_copy(g) or _string_literal(g)
                                        or _class_object_in_space(g) for g in errors):
            continue
        if not found and not second:
            found = [Violation("<clang>", 0, "compile", res.stderr[-2000:])]
        if found:
            return found
    stamp.touch()
    return []


def _shim_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(INCLUDE.rglob("*")):
        if p.is_file():
            h.update(p.read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()


_EXPECT = re.compile(r"^// strict-pass: expect ([\w-]+(?:, [\w-]+)*)$", re.M)


def expected_rules(path: Path) -> set[str]:
    """The rules a self-test source declares it breaks (a line
    `// strict-pass: expect rule, rule`): a source that exists to show the
    executor catching a defect which the strict pass sees too. It builds
    only if the pass finds exactly those rules; metal/ may not declare any."""
    m = _EXPECT.search(Path(path).read_text())
    if m and Path(path).resolve().is_relative_to(ROOT / "metal"):
        raise StrictError(f"{path.name}: the project's kernels cannot expect strict-pass violations")
    return set(m.group(1).split(", ")) if m else set()


def violations(text: str, version: int, cache: Path) -> list[Violation]:
    """Every strict rule on one scanned source, in order: the source scan
    and source analyses, the C++ front end, the OpenCL front end and the
    analyses on its AST (a later stage runs once the earlier ones pass)."""
    from . import analysis, opencl

    found = scan_rules(text, version) + analysis.kernel_rules(text)
    if not found:
        found = clang_check(text, version, cache)
    if not found:
        found = opencl.check(text, version, cache)
    return found


def check(path: Path, text: str, version: int, cache: Path) -> None:
    """violations() on one scanned source; StrictError lists what fails."""
    found = violations(text, version, cache)
    expected = expected_rules(path)
    if expected and expected == {v.rule for v in found}:
        return
    if found or expected:
        lines = "\n".join(f"  {v}" for v in found[:20])
        more = f"\n  ... and {len(found) - 20} more" if len(found) > 20 else ""
        missing = f"\n  expected and not found: {sorted(expected - {v.rule for v in found})}" if expected else ""
        raise StrictError(
            f"{path.name} is not valid {version_text(version)} for Apple's compiler "
            f"(strict harness rules):\n{lines}{more}{missing}"
        )
