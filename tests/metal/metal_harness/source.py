"""Reading and rewriting a preprocessed .metal translation unit.

The harness preprocesses a .metal file with the shim in *scan* mode (the MSL
headers expand to nothing, so the address-space words survive and every
project macro is expanded), then:

* finds the kernels (``[[kernel]]``/``kernel`` functions), the attribute of
  each parameter, and the ``[[host_name]]`` explicit instantiations;
* rewrites ``threadgroup`` variable declarations into per-group storage
  (``auto& tile = *::mh::tg_var<float[8][33]>(id, "tile");``), the
  ``[[threadgroup(n)]]`` attribute (``threadgroup`` is a macro later) and
  ``1.0h`` half literals;
* appends, after each instantiation (or non-template kernel body), a
  registration object binding the host name to the function and its
  parameter attributes.

The result compiles as C++ with the real shim force-included; the GNU line
markers kept from preprocessing make compiler errors and the source
locations recorded by barriers point at the .metal lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

BUILTINS = (
    "thread_position_in_grid",
    "threadgroup_position_in_grid",
    "thread_position_in_threadgroup",
    "threads_per_threadgroup",
    "threadgroups_per_grid",
    "threads_per_grid",
    "thread_index_in_threadgroup",
    "thread_index_in_simdgroup",
    "simdgroup_index_in_threadgroup",
    "simdgroups_per_threadgroup",
    "threads_per_simdgroup",
    "thread_index_in_quadgroup",
    "quadgroup_index_in_threadgroup",
    "quadgroups_per_threadgroup",
    "dispatch_threads_per_threadgroup",
    "dispatch_simdgroups_per_threadgroup",
    "dispatch_quadgroups_per_threadgroup",
    "grid_origin",
    "grid_size",
)

# Attributes that need hardware or pipeline state the harness does not model.
UNSUPPORTED_ATTRS = {
    "stage_in": "[[stage_in]] inputs",
    "texture": "textures",
    "sampler": "samplers",
    "id": "argument buffers",
}


class SourceError(Exception):
    """The .metal source uses something the harness cannot run."""


@dataclass
class Param:
    name: str
    kind: str  # 'b' buffer, 't' threadgroup buffer, '@' built-in
    index: int = 0
    builtin: str = ""
    condition: str = ""  # a function constant: the parameter exists where it is true

    def cxx(self) -> str:
        if self.kind == "@":
            value = f"int(::mh::Builtin::{self.builtin})"
        else:
            value = str(self.index)
        enabled = f", +[]() -> bool {{ return bool({self.condition}); }}" if self.condition else ""
        return f"{{'{self.kind}', {value}, \"{self.name}\"{enabled}}}"


@dataclass
class Kernel:
    function: str
    params: list[Param]
    is_template: bool
    max_threads: str = "0"  # [[max_total_threads_per_threadgroup(n)]], as written
    host_name: str | None = None  # non-template kernels
    body_end: int = 0
    template_params: list[str] = field(default_factory=list)  # names, in order


@dataclass
class Instance:
    host_name: str
    function: str  # as the instantiation names it (possibly qualified)
    template_args: str  # "" for non-template kernels
    kernel: Kernel

    @property
    def cxx_name(self) -> str:
        if self.template_args:
            return f"{self.function}<{self.template_args}>"
        return self.function


@dataclass
class FunctionConstant:
    """`constant T name [[function_constant(index)]];`: a value set when the
    pipeline is made (run_kernel's `function_constants`)."""

    name: str
    type: str
    index: int
    start: int = 0  # of the declaration in the scanned text
    end: int = 0  # its `;`


@dataclass
class Unit:
    text: str  # rewritten translation unit
    instances: dict[str, Instance] = field(default_factory=dict)
    function_constants: dict[int, FunctionConstant] = field(default_factory=dict)


_ATTR_BLOCK = r"\[\[(?:[^\[\]]|\[(?!\[))*\]\]"
_KERNEL_RE = re.compile(
    r"(?P<pre>(?:" + _ATTR_BLOCK + r"\s*|\bkernel\b\s*)+)void\s+(?P<name>[A-Za-z_]\w*)\s*\("
)
_INSTANCE_RE = re.compile(
    r"\btemplate\s+(?P<attrs>(?:" + _ATTR_BLOCK + r"\s*)+)(?P<decl>[^;{}]*);"
)
_ATTR_ITEM_RE = re.compile(r"([A-Za-z_]\w*)\s*(?:\(\s*([^()]*?)\s*\))?")
_PARAM_ATTR_RE = re.compile(r"\[\[\s*([A-Za-z_]\w*)\s*(?:\(\s*([^()]*?)\s*\))?\s*\]\]")
_HALF_LITERAL_RE = re.compile(
    r"(?<![\w.])((?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+)[hH]\b"
)
_LINE_MARKER_RE = re.compile(r"^#.*$", re.M)
_OPEN = {"(": ")", "[": "]", "{": "}", "<": ">"}
_CLOSE = {v: k for k, v in _OPEN.items()}


def _mask_literals(text: str) -> str:
    """Blank out the insides of string and character literals."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                if text[j] == "\\":
                    out[j] = " "
                    j += 1
                if j < n:
                    out[j] = " " if text[j] != "\n" else "\n"
                j += 1
            i = j + 1
        else:
            i += 1
    return "".join(out)


def _match_forward(text: str, start: int, pairs: str = "()") -> int:
    """Index of the bracket closing the one at `start`."""
    open_c, close_c = pairs
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_c:
            depth += 1
        elif text[i] == close_c:
            depth -= 1
            if depth == 0:
                return i
    raise SourceError(f"unbalanced {pairs!r} at offset {start}")


def _split_top(text: str, sep: str = ",") -> list[str]:
    parts, depth, cur = [], 0, []
    for c in text:
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return parts


def _attr_items(pre: str) -> list[tuple[str, str]]:
    items = []
    for block in re.findall(_ATTR_BLOCK, pre):
        for part in _split_top(block[2:-2]):
            m = _ATTR_ITEM_RE.fullmatch(part.strip())
            if m:
                items.append((m.group(1), m.group(2) or ""))
    return items


def host_name(attrs: str) -> str | None:
    """The name in a `[[host_name("...")]]` attribute of `attrs`, adjacent
    string literals joined (`host_name("v_" "Abs" "float32")`, as macros
    that stringise their arguments write it)."""
    m = re.search(r'\bhost_name\s*\(\s*((?:"[^"]*"\s*)+)\)', attrs)
    return "".join(re.findall(r'"([^"]*)"', m.group(1))) if m else None


def template_start(masked: str, start: int) -> int:
    """Offset of the `template` keyword heading the declaration at `start`, or -1."""
    head = masked[max(0, start - 20000) : start].rstrip()
    offset = max(0, start - 20000)
    if not head.endswith(">"):
        return -1
    depth = 0
    for i in range(len(head) - 1, -1, -1):
        if head[i] == ">":
            depth += 1
        elif head[i] == "<":
            depth -= 1
            if depth == 0:
                before = head[:i].rstrip()
                return offset + len(before) - len("template") if before.endswith("template") else -1
    return -1


def _is_template(masked: str, start: int) -> bool:
    return template_start(masked, start) >= 0


def param_attrs(raw: str) -> list[tuple[str, str]]:
    """The attributes of a parameter, every item of every [[...]] block."""
    return _attr_items(" ".join(re.findall(_ATTR_BLOCK, raw)))


def param_bindings(params: list[tuple[str, list[tuple[str, str]]]]) -> list[tuple[str, int | str]]:
    """(kind, index or built-in) per kernel parameter given as (declaration
    without attributes, attributes): 'b' [[buffer(n)]], 't' [[threadgroup(n)]]
    (also spelled mh_threadgroup), '@' a built-in, '?' none of those. A
    pointer or reference without an index attribute takes the first index
    of its table not taken, in order (MSL's automatic assignment): buffers
    for device and constant ones, threadgroup memory for threadgroup ones."""
    out: list[tuple[str, int | str]] = []
    taken = {"b": set(), "t": set()}
    for decl, attrs in params:
        kind: tuple[str, int | str] = ("?", "")
        for attr, arg in attrs:
            if attr == "buffer":
                kind = ("b", int(arg, 0))
            elif attr in ("threadgroup", "mh_threadgroup"):
                kind = ("t", int(arg, 0))
            elif attr in BUILTINS or attr == "thread_execution_width":
                kind = ("@", attr)
            else:
                continue
            break
        if kind[0] in taken:
            taken[kind[0]].add(kind[1])
        out.append(kind)
    for i, (decl, attrs) in enumerate(params):
        if out[i][0] != "?" or not re.search(r"[*&[]", decl):
            continue
        table = "t" if re.search(r"\bthreadgroup\b(?!_)", decl) else "b"
        index = next(n for n in range(len(params) + 32) if n not in taken[table])
        taken[table].add(index)
        out[i] = (table, index)
    return out


def _parse_params(raw_params: str, function: str) -> list[Param]:
    params = []
    for raw in _split_top(raw_params) if raw_params.strip() else []:
        text = _LINE_MARKER_RE.sub(" ", raw).strip()
        attrs = param_attrs(text)
        bare = re.sub(_ATTR_BLOCK, " ", text)
        names = re.findall(r"[A-Za-z_]\w*", bare)
        params.append((text, bare, names[-1] if names else "?", attrs))
    out = []
    for (text, bare, name, attrs), (kind, index) in zip(
            params, param_bindings([(bare, attrs) for _, bare, _, attrs in params])):
        for attr, _ in attrs:
            if attr in UNSUPPORTED_ATTRS:
                raise SourceError(f"kernel {function}: {UNSUPPORTED_ATTRS[attr]} are not emulated")
        condition = next((arg for attr, arg in attrs if attr == "function_constant"), "")
        if kind == "?":
            known = [a for a, _ in attrs if a != "function_constant"]
            if known:
                raise SourceError(f"kernel {function}: unsupported parameter attribute [[{known[0]}]]")
            raise SourceError(
                f"kernel {function}: parameter '{text}' has no attribute; the harness "
                "binds parameters by [[buffer(n)]], [[threadgroup(n)]] or a built-in"
            )
        if kind == "@":
            builtin = "threads_per_simdgroup" if index == "thread_execution_width" else index
            out.append(Param(name, "@", builtin=builtin, condition=condition))
        else:
            out.append(Param(name, kind, index, condition=condition))
    return out


def template_params(masked: str, start: int) -> list[str]:
    """Names of the template parameters of the declaration at `start`."""
    head = template_start(masked, start)
    if head < 0:
        return []
    lt = masked.index("<", head)
    names = []
    for raw in _split_top(masked[lt + 1 : _match_forward(masked, lt, "<>")]):
        decl = raw.partition("=")[0]
        m = re.search(r"([A-Za-z_]\w*)\s*$", decl)
        names.append(m.group(1) if m else "")
    return names


_FUNCTION_CONSTANT_RE = re.compile(
    r"(?P<quals>(?:\b(?:static|constant|constexpr|const)\b\s*)+)(?P<type>[A-Za-z_][\w:]*(?:\s*<[^<>;]*>)?)\s+"
    r"(?P<name>[A-Za-z_]\w*)\s*\[\[\s*function_constant\s*\(\s*(?P<index>\d+)\s*\)\s*\]\]\s*;"
)


def function_constants(masked: str) -> list[FunctionConstant]:
    """The unit's function constant declarations."""
    return [FunctionConstant(m.group("name"), " ".join(m.group("type").split()), int(m.group("index")),
                             m.start(), m.end())
            for m in _FUNCTION_CONSTANT_RE.finditer(masked)]


def _template_id(decl: str) -> tuple[str, str]:
    """(function as written, template arguments) of an explicit instantiation."""
    d = decl.strip()
    if d.startswith("decltype"):
        close = _match_forward(d, d.index("("))
        d = d[close + 1 :].strip()
    m = re.search(r"([A-Za-z_][\w:]*)\s*<", d)
    if not m:
        raise SourceError(f"cannot read the instantiation '{decl.strip()}'")
    lt = m.end() - 1
    gt = _match_forward(d, lt, "<>")
    return m.group(1), " ".join(d[lt + 1 : gt].split())


@dataclass
class SharedDecl:
    """A `threadgroup T name[dims];` variable: offsets of the word and the `;`."""

    start: int
    end: int
    type: str
    name: str
    dims: str
    init: bool = False  # has an initializer (lenient only)

    @property
    def type_id(self) -> str:
        return f"{self.type}{self.dims.replace(' ', '')}"


def threadgroup_decls(text: str, masked: str, lenient: bool = False) -> list[SharedDecl]:
    """The threadgroup variable declarations of a unit; one the executor
    cannot hold (an initializer, several names) raises, or with `lenient`
    is left out."""
    out = []
    for m in re.finditer(r"\bthreadgroup\b(?!_)", masked):
        j = m.start() - 1
        while j >= 0 and masked[j].isspace():
            j -= 1
        if j >= 0 and masked[j] in "<,(":
            continue  # a template argument or a parameter: not a variable
        i = m.end()
        depth = 0
        pointer = False
        end = None
        while i < len(masked):
            c = masked[i]
            if c in "([<{":
                depth += 1
            elif c in ")]>}":
                if depth == 0:
                    break  # closes something opened before: a cast or a parameter
                depth -= 1
            elif depth == 0 and c in "*&":
                pointer = True
            elif depth == 0 and c in ";,=":
                end = i
                break
            i += 1
        if pointer or end is None:
            continue
        decl = " ".join(_LINE_MARKER_RE.sub(" ", text[m.end() : end]).split())
        dm = re.fullmatch(
            r"(?P<type>.+?)\s*\b(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\[\]]*\]\s*)*)", decl
        )
        if masked[end] != ";" or not dm or not dm.group("type").strip():
            if lenient and dm and dm.group("type").strip() and masked[end] == "=":
                init = SharedDecl(m.start(), end, dm.group("type").strip(), dm.group("name"), dm.group("dims"), True)
                out.append(init)  # refused by the strict pass, not here
                continue
            if lenient:
                continue
            raise SourceError(
                f"unsupported threadgroup declaration 'threadgroup {decl}{masked[end]}' "
                "(declare one variable per statement, without an initializer)"
            )
        out.append(SharedDecl(m.start(), end, dm.group("type").strip(), dm.group("name"), dm.group("dims")))
    return out


_SPACE_QUALIFIERS = ("thread", "device", "constant", "threadgroup", "threadgroup_imageblock", "ray_data",
                     "object_data")
_SPACE_WORD_RE = re.compile(r"\b(?:" + "|".join(_SPACE_QUALIFIERS) + r")\b(?!_)")
# The end of a function's parameter list in a definition: `)`, qualifiers,
# then its body, a constructor's initializers or a trailing return type.
_DEFINITION_RE = re.compile(
    r"\)(?P<quals>(?:\s*\b(?:const|volatile|noexcept|mh_class_\w+|" + "|".join(_SPACE_QUALIFIERS)
    + r")\b)*)\s*(?=\{|:(?!:)|->)"
)
_NOT_FUNCTIONS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "alignof", "decltype",
                  "static_assert", "static_cast", "reinterpret_cast", "const_cast", "noexcept", "requires"}


def _scope_starts(masked: str) -> list[int]:
    """For each offset, the offset of the innermost `{` open there (-1 at
    file scope)."""
    out = [-1] * (len(masked) + 1)
    stack: list[int] = []
    for i, c in enumerate(masked):
        if c == "{":
            stack.append(i)
        out[i] = stack[-1] if stack else -1
        if c == "}" and stack:
            stack.pop()
    return out


def _declaration_start(masked: str, name_at: int) -> int:
    """Start of the declaration whose name is at `name_at`: after the
    previous `;`, `{`, `}` or access specifier outside brackets."""
    depth = 0
    i = name_at - 1
    while i >= 0:
        c = masked[i]
        if c in ")]":
            depth += 1
        elif c in "([":
            depth -= 1
        elif depth == 0 and c in ";{}":
            break
        elif depth == 0 and c == ":" and re.search(r"\b(?:public|private|protected)\s*$", masked[max(0, i - 40) : i]):
            break
        i -= 1
    return i + 1


def _definition_end(masked: str, after: int) -> int:
    """One past the body of a function whose parameter list and qualifiers
    end at `after` (a body, a constructor's initializers then a body, or a
    trailing return type then a body)."""
    i = after
    while masked[i].isspace():
        i += 1
    if masked[i] == "{":
        return _match_forward(masked, i, "{}") + 1
    if masked.startswith("->", i):
        depth = 0
        for j in range(i, len(masked)):
            if masked[j] in "([<":
                depth += 1
            elif masked[j] in ")]>":
                depth -= 1
            elif masked[j] == "{" and depth <= 0:
                return _match_forward(masked, j, "{}") + 1
        raise SourceError(f"no body after the trailing return type at offset {i}")
    # A constructor's initializers: `name(args)` or `name{args}`, then the body.
    i += 1
    item = re.compile(r"\s*[\w:]+\s*(?:<[^(){};]*>)?\s*")
    while True:
        i = item.match(masked, i).end()
        if masked[i] not in "({":
            raise SourceError(f"cannot read the constructor initializers at offset {i}")
        i = _match_forward(masked, i, "()" if masked[i] == "(" else "{}") + 1
        while masked[i].isspace():
            i += 1
        if masked[i] == ",":
            i += 1
            continue
        return _match_forward(masked, i, "{}") + 1


def _without_template_heads(decl: str) -> str:
    """A declaration's text without its `template <...>` heads."""
    out = decl
    while True:
        m = re.search(r"\btemplate\s*<", out)
        if not m:
            return out
        try:
            gt = _match_forward(out, m.end() - 1, "<>")
        except SourceError:
            return out
        out = out[: m.start()] + out[gt + 1 :]


def _open_paren(masked: str, close: int) -> int:
    depth = 0
    for j in range(close, -1, -1):
        if masked[j] == ")":
            depth += 1
        elif masked[j] == "(":
            depth -= 1
            if depth == 0:
                return j
    return -1


def space_overload_edits(text: str, masked: str, erased: set[str] | None = None,
                         strip_methods: bool = False) -> list[tuple[int, int, str]]:
    """Functions overloaded only on address spaces, made one for a compiler
    in which those spaces are one: MSL overloads a member function on the
    space of its object (`operator bool() const device`) and any function on
    the spaces of its parameters (`f(thread T&)`, `f(device T&)`); where the
    words that tell them apart are empty (`erased`: the executor's g++, all
    of them; clang's C++ mode, class objects' spaces in its first run), the
    first definition of each group stays (the default-space one where there
    is one) and the others are blanked. With `strip_methods`, the address-
    space words after a parameter list go as well (clang's C++ mode has no
    address-space method qualifiers; the OpenCL front end, which has them,
    checks those calls)."""
    erased = set(_SPACE_QUALIFIERS) if erased is None else set(erased) | {"thread"}
    scopes = _scope_starts(masked)
    words = re.compile(r"\b(?:" + "|".join(sorted(erased)) + r")\b(?!_)")
    groups: dict[tuple, list[tuple[int, int, str, int, tuple[int, int]]]] = {}
    strip: list[tuple[int, int]] = []
    for m in _DEFINITION_RE.finditer(masked):
        close = m.start()
        open_paren = _open_paren(masked, close)
        if open_paren < 0:
            continue
        before = masked[max(0, open_paren - 400) : open_paren].rstrip()
        name = re.search(r"(?:operator\b[^;{}()]*?|[~A-Za-z_]\w*)\s*$", before)
        if not name or name.group(0).strip() in _NOT_FUNCTIONS or before.endswith("]"):
            continue
        quals = m.group("quals")
        method_spaces = _SPACE_WORD_RE.findall(quals) + re.findall(r"\bmh_class_\w+", quals)
        if strip_methods and any(w != "thread" for w in method_spaces):
            strip.append(m.span("quals"))
        start = _declaration_start(masked, open_paren)
        head_text = masked[start : close + 1]
        if not _SPACE_WORD_RE.search(head_text) and not method_spaces and "mh_class_" not in head_text + quals:
            continue
        if re.search(r"(?:^|[^=!<>])=(?!=)|\?|\breturn\b", _without_template_heads(masked[start : name.start()])):
            continue  # an expression, not a declaration
        plain = " ".join(_LINE_MARKER_RE.sub(" ", head_text).split())
        key_head = " ".join(words.sub(" ", plain).split())
        key_quals = " ".join(w for w in quals.split() if w not in _SPACE_QUALIFIERS and not w.startswith("mh_class_"))
        spaced = bool(re.search(r"\b(?:device|constant|threadgroup)\b", plain)) or any(
            w != "thread" for w in method_spaces)
        groups.setdefault((scopes[start], key_head, key_quals), []).append(
            (start, m.end(), plain + " " + quals, int(spaced), m.span("quals")))
    edits = []
    blanked: list[tuple[int, int]] = []
    for members in groups.values():
        if len({p for _, _, p, _, _ in members}) < 2:
            continue  # one definition (or the same text twice: not overloads)
        keep = min(members, key=lambda x: (x[3], x[0]))
        for start, after, _, _, _ in members:
            if start == keep[0]:
                continue
            end = _definition_end(masked, after)
            blanked.append((start, end))
            edits.append((start, end, "".join(c if c == "\n" else " " for c in text[start:end])))
    for q0, q1 in strip:
        if any(a <= q0 < b for a, b in blanked):
            continue
        edits.append((q0, q1, re.sub(r"\b(?:mh_class_\w+|" + "|".join(_SPACE_QUALIFIERS) + r")\b(?!_)",
                                     lambda w: " " * len(w.group(0)), masked[q0:q1])))
    return edits


def _threadgroup_edits(text: str, masked: str) -> list[tuple[int, int, str]]:
    """Rewrite `threadgroup T name[dims];` declarations to shared storage."""
    edits = []
    for counter, d in enumerate(threadgroup_decls(text, masked), 1):
        repl = f'auto& {d.name} = *::mh::tg_var<{d.type_id}>({counter}, "{d.name}")'
        edits.append((d.start, d.end, repl))
    return edits


def _max_threads(inst: Instance) -> str:
    """The kernel's thread limit for this instantiation, a C++ expression
    with the template parameters replaced by its arguments."""
    expr = inst.kernel.max_threads
    if inst.template_args:
        args = [a.strip() for a in _split_top(inst.template_args)]
        values = dict(zip(inst.kernel.template_params, args))
        expr = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: f"({values[m.group(0)]})" if m.group(0) in values else m.group(0),
                      expr)
    return expr


def _class_specializations(text: str) -> list[tuple[int, int, str]]:
    """`template <>` before a member inside its class (an explicit
    specialization in class scope, which clang takes and g++ does not) made a
    plain member: an overload the call prefers in the same cases."""
    masked = _mask_literals(text)
    scopes = _scope_starts(masked)
    edits = []
    for m in re.finditer(r"\btemplate\s*<\s*>", masked):
        scope = scopes[m.start()]
        if scope >= 0 and re.search(r"\b(?:struct|class|union)\b[^;{}()]*$", masked[max(0, scope - 300) : scope]):
            edits.append((m.start(), m.end(), " " * (m.end() - m.start())))
    return edits


_SPECIALIZATION_RE = re.compile(r"\btemplate\s*<")
_SPECIALIZED_CLASS_RE = re.compile(r"\s*(?:struct|class|union)\s+[A-Za-z_]\w*\s*<")
_TO_BRACE_RE = re.compile(r"[^;{}]*\{")
_SEMICOLON_RE = re.compile(r"\s*;")


def space_specialization_edits(text: str, masked: str, erased: set[str] | None = None) -> list[tuple[int, int, str]]:
    """Class template specializations that differ only in address spaces
    (`pointer_element<device T*>`, `<thread T*>`: MLX's type_traits.h) made
    one where those words are empty, as space_overload_edits does for
    functions: the first stays, the others are blanked."""
    erased = set(_SPACE_QUALIFIERS) if erased is None else set(erased) | {"thread"}
    words = re.compile(r"\b(?:" + "|".join(sorted(erased)) + r")\b(?!_)")
    scopes = _scope_starts(masked)
    groups: dict[tuple, list[tuple[int, int, str]]] = {}
    for m in _SPECIALIZATION_RE.finditer(masked):
        try:
            gt = _match_forward(masked, m.end() - 1, "<>")
        except SourceError:
            continue
        head = _SPECIALIZED_CLASS_RE.match(masked, gt + 1)
        if not head:
            continue
        lt = head.end() - 1
        try:
            close = _match_forward(masked, lt, "<>")
        except SourceError:
            continue
        brace = _TO_BRACE_RE.match(masked, close + 1)
        if not brace or not words.search(masked[lt:close]):
            continue
        body = brace.end() - 1
        end = _match_forward(masked, body, "{}") + 1
        semi = _SEMICOLON_RE.match(masked, end)
        end = semi.end() if semi else end
        plain = " ".join(_LINE_MARKER_RE.sub(" ", masked[m.start() : close + 1]).split())
        key = (scopes[m.start()], " ".join(words.sub(" ", plain).split()))
        groups.setdefault(key, []).append((m.start(), end, plain))
    edits = []
    for members in groups.values():
        if len({p for _, _, p in members}) < 2:
            continue
        for start, end, _ in members[1:]:
            edits.append((start, end, "".join(c if c == "\n" else " " for c in text[start:end])))
    return edits


def apply_edits(text: str, edits: list[tuple[int, int, str]]) -> str:
    """The text with each (start, end, replacement) applied, in one pass: an
    insertion at a replaced span's start goes before it, and an edit inside
    a span another edit replaces is dropped (that edit rewrites it whole)."""
    out, at = [], 0
    for start, end, repl in sorted(edits, key=lambda e: (e[0], e[1])):
        if start < at:
            continue
        out.append(text[at:start])
        out.append(repl)
        at = max(at, end)
    out.append(text[at:])
    return "".join(out)


def process(text: str) -> Unit:
    """Parse and rewrite one preprocessed translation unit."""
    # One host function per member overloaded only on address spaces
    # (same length: the offsets below hold).
    masked = _mask_literals(text)
    text = apply_edits(text, space_overload_edits(text, masked, strip_methods=True)
                       + space_specialization_edits(text, masked) + _class_specializations(text))
    masked = _mask_literals(text)
    edits: list[tuple[int, int, str]] = []

    for m in re.finditer(r"\[\[\s*threadgroup\s*\(", masked):
        edits.append((m.start(), m.end(), "[[mh_threadgroup("))

    kernels: dict[str, Kernel] = {}
    unit = Unit(text="")
    registrations: list[tuple[int, Instance]] = []
    attr_spans = [(a.start(), a.end()) for a in re.finditer(_ATTR_BLOCK, masked)]
    for m in _KERNEL_RE.finditer(masked):
        pre = m.group("pre")
        items = _attr_items(pre)
        if not (re.search(r"\bkernel\b", re.sub(_ATTR_BLOCK, " ", pre)) or any(k == "kernel" for k, _ in items)):
            continue
        name = m.group("name")
        open_paren = m.end() - 1
        close = _match_forward(masked, open_paren)
        if not masked[close + 1 : close + 2000].lstrip().startswith("{"):
            continue  # a declaration; the definition comes elsewhere
        body_open = masked.index("{", close)
        body_end = _match_forward(masked, body_open, "{}")
        raw_params = text[open_paren + 1 : close]
        raw_params = re.sub(r"\[\[\s*threadgroup\s*\(", "[[mh_threadgroup(", raw_params)
        params = _parse_params(raw_params, name)
        max_threads = "0"
        host = None
        for key, arg in items:
            if key == "max_total_threads_per_threadgroup":
                max_threads = arg
            if key == "host_name":
                host = host_name(text[m.start("pre") : m.end("pre")])
        k = Kernel(name, params, _is_template(masked, m.start()), max_threads, host, body_end,
                   template_params(masked, m.start()))
        kernels[name] = k
        if not k.is_template:
            inst = Instance(host or name, name, "", k)
            registrations.append((body_end + 1, inst))

    for m in _INSTANCE_RE.finditer(masked):
        attrs_text = text[m.start("attrs") : m.end("attrs")]
        name = host_name(attrs_text)
        if name is None:
            continue
        written, targs = _template_id(text[m.start("decl") : m.end("decl")])
        function = written.split("::")[-1]
        if function not in kernels:
            raise SourceError(f"[[host_name(\"{name}\")]] names {written}, not a kernel defined here")
        inst = Instance(name, written, targs, kernels[function])
        registrations.append((m.end(), inst))

    for pos, inst in registrations:
        if inst.host_name in unit.instances:
            raise SourceError(f"host name '{inst.host_name}' defined twice")
        unit.instances[inst.host_name] = inst
        i = len(unit.instances)
        ps = inst.kernel.params
        if ps:
            arr = f"static const ::mh::Param mh_params_{i}[] = {{{', '.join(p.cxx() for p in ps)}}};"
            ref = f"mh_params_{i}"
        else:
            arr, ref = "", "nullptr"
        reg = (
            f" {arr} static ::mh::Registrar<&{inst.cxx_name}> mh_registrar_{i}"
            f'{{"{inst.host_name}", "{inst.cxx_name}", {ref}, {len(ps)}, int({_max_threads(inst)})}};'
        )
        edits.append((pos, pos, reg))

    # `constant` is read-only: const, unless the declaration has a const
    # already (g++ takes no duplicate).
    fc_spans = [(fc.start, fc.end) for fc in function_constants(masked)]
    for m in re.finditer(r"\bconstant\b(?!_)", masked):
        if any(a <= m.start() < b for a, b in attr_spans + fc_spans):
            continue
        before = re.findall(r"[\w:]+|[^\w\s]", masked[max(0, m.start() - 40) : m.start()])[-2:]
        after = re.findall(r"[\w:]+|[^\w\s]", masked[m.end() : m.end() + 80])[:4]
        if ")" in before[-1:]:
            continue  # a method qualifier: stripped above
        ahead = []
        for tok in after:
            if tok in ("*", "&", ",", ")", ";", "=", "[", "("):
                break
            ahead.append(tok)
        dup = "const" in before or "const" in ahead
        edits.append((m.start(), m.end(), " " * len("constant") if dup else "const   "))

    # Function constants read the dispatch's values (mh::FunctionConstant).
    for fc in function_constants(masked):
        if fc.index in unit.function_constants:
            raise SourceError(f"function constants '{unit.function_constants[fc.index].name}' and '{fc.name}' "
                              f"both have index {fc.index}")
        unit.function_constants[fc.index] = fc
        edits.append((fc.start, fc.end,
                      f'static const ::mh::FunctionConstant<{fc.type}, {fc.index}> {fc.name}{{"{fc.name}"}};'))

    edits += _threadgroup_edits(text, masked)
    for m in _HALF_LITERAL_RE.finditer(masked):
        edits.append((m.start(), m.end(), f"((half)({m.group(1)}))"))

    # Line markers without their include flags: the compile pass has another
    # include stack, and a "returning to file" flag it cannot match would be
    # ignored, leaving lines attributed to the generated file.
    for m in re.finditer(r'^# (\d+) "([^"]*)"((?: \d)+)$', text, re.M):
        edits.append((m.start(3), m.end(3), ""))

    out = text
    last = len(text) + 1
    for start, end, repl in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        if end > last:
            raise SourceError("overlapping rewrites (harness pre-pass bug)")
        out = out[:start] + repl + out[end:]
        last = start
    unit.text = out
    return unit
