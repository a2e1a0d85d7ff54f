"""The strict pass's own analyses: MSL's and Apple GPUs' rules that neither
clang front end checks.

* kernel_rules, on the source: a kernel's resource indices and limits
  (`[[buffer(n)]]` and `[[threadgroup(n)]]` at most 30 and distinct,
  `[[max_total_threads_per_threadgroup(n)]]` at most 1024, at most 31
  threadgroup allocations), the types of its built-in parameters, and no
  function named `main`;
* ast_rules, on clang's AST of the OpenCL unit (every template
  instantiation included): no recursion (a cycle in the call graph), and
  barriers and simd-/quad-group functions reached in control flow uniform
  over the threads that must reach them together (a taint analysis from
  the per-thread built-ins).

The threadgroup-memory total per kernel is a static_assert in the OpenCL
unit (opencl.py); launch sizes are checked where the host dispatches
(runtime.cpp).
"""

from __future__ import annotations

import re
from collections import defaultdict

from . import source as src
from . import strict

MAX_BUFFER_INDEX = 30  # 31 entries in the buffer and threadgroup-memory argument tables
MAX_THREADS_PER_THREADGROUP = 1024
MAX_THREADGROUP_ALLOCATIONS = 31

# Built-in kernel inputs: the grid-shaped ones take uint or ushort, scalar or
# vector; the counts and indices take a scalar.
_GRID = {
    "thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
    "threads_per_grid", "threads_per_threadgroup", "threadgroups_per_grid",
    "dispatch_threads_per_threadgroup", "grid_origin", "grid_size",
}
_SCALAR = {
    "thread_index_in_threadgroup", "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup",
    "simdgroups_per_threadgroup", "threads_per_simdgroup", "thread_execution_width",
    "thread_index_in_quadgroup", "quadgroup_index_in_threadgroup", "quadgroups_per_threadgroup",
    "dispatch_simdgroups_per_threadgroup", "dispatch_quadgroups_per_threadgroup",
}
_TYPE_NAMES = {"unsigned int": "uint", "unsigned short": "ushort", "uint32_t": "uint", "uint16_t": "ushort"}


def _type_of(decl: str) -> str:
    t = re.sub(r"\b(?:const|metal\s*::)\s*", "", decl).strip()
    return _TYPE_NAMES.get(" ".join(t.split()), t)


def _builtin_rules(kernel, at) -> list[strict.Violation]:
    """Built-in inputs: the types their attributes take, one vector width, each once."""
    out = []
    where = at(kernel.start)
    seen: dict[str, str] = {}
    widths: dict[str, str] = {}
    for ptype, name, attrs in kernel.param_list():
        for attr, _ in attrs:
            if attr not in _GRID and attr not in _SCALAR:
                continue
            t = _type_of(ptype)
            ok = re.fullmatch(r"u(?:int|short)", t) if attr in _SCALAR else re.fullmatch(r"u(?:int|short)[23]?", t)
            if not ok:
                allowed = "uint or ushort" if attr in _SCALAR else "uint, ushort or their 2- and 3-vectors"
                out.append(f"built-in '{name}' [[{attr}]] is declared '{ptype}'; it takes {allowed}")
            key = "threads_per_simdgroup" if attr == "thread_execution_width" else attr
            if key in seen:
                out.append(f"[[{attr}]] is declared twice ('{seen[key]}' and '{name}')")
            seen[key] = name
            if attr in _GRID and ok and t[-1].isdigit():
                widths[name] = t[-1]
    if len(set(widths.values())) > 1:
        listed = ", ".join(f"{n}: {w}" for n, w in widths.items())
        out.append(f"vector built-ins of one kernel have one number of components ({listed})")
    return [strict.Violation(strict._short(where[0]), where[1], "builtin", f"kernel '{kernel.name}': {m}")
            for m in out]


_SPACE = re.compile(r"\b(device|constant|threadgroup|thread)\b(?!_)")
_RESOURCE_TYPES = re.compile(r"\b(?:texture\w*|depth\w*|sampler|array<|acceleration_structure|intersection_function_table"
                             r"|visible_function_table|indirect_command_buffer|command_buffer)\b")


def _binding_rules(kernel, at) -> list[strict.Violation]:
    """What a kernel parameter's attribute binds it to: [[buffer(n)]] a
    device or constant pointer or reference, [[threadgroup(n)]] a
    threadgroup pointer or reference; without an attribute, a pointer or
    reference (bound automatically), a resource type or nothing (MSL:
    a kernel's inputs are buffers, textures, samplers, threadgroup memory
    and built-in values)."""
    out = []
    for ptype, name, attrs in kernel.param_list():
        kinds = {a for a, _ in attrs}
        points = bool(re.search(r"[*&[]", ptype))  # an array parameter is a pointer
        space = next(iter(_SPACE.findall(ptype)), None)
        if "buffer" in kinds and not (points and space in ("device", "constant")):
            out.append(f"'{name}' [[buffer(n)]] is '{ptype}'; a buffer binds a device or constant pointer or reference")
        if "threadgroup" in kinds and not (points and space == "threadgroup"):
            out.append(f"'{name}' [[threadgroup(n)]] is '{ptype}'; it binds a threadgroup pointer or reference")
        if not kinds - {"function_constant"} and not points and not _RESOURCE_TYPES.search(ptype):
            out.append(f"'{name}' ('{ptype}') has no attribute; a kernel takes values only as built-ins "
                       "([[thread_position_in_grid]] and kin) or through buffers")
    where = at(kernel.start)
    return [strict.Violation(strict._short(where[0]), where[1], "kernel-signature", f"kernel '{kernel.name}': {m}")
            for m in out]


def _index_rules(kernel, at) -> list[strict.Violation]:
    """Resource indices: at most 30, one parameter per index and table
    (pointers and references without an index take the first free one)."""
    out = []
    where = at(kernel.start)
    used: dict[tuple[str, int], str] = {}
    params = kernel.param_list()
    tables = {"b": "buffer", "t": "threadgroup"}
    for (ptype, name, _), (kind, index) in zip(params, src.param_bindings([(t, a) for t, _, a in params])):
        if kind not in tables:
            continue
        attr = tables[kind]
        if index > MAX_BUFFER_INDEX:
            out.append(f"'{name}' is bound at [[{attr}({index})]]; Apple GPUs' {attr} table has indices "
                       f"0 to {MAX_BUFFER_INDEX}")
        if (attr, index) in used:
            out.append(f"'{used[attr, index]}' and '{name}' are both bound at [[{attr}({index})]]")
        used[attr, index] = name
    for key, arg in kernel.attrs:
        if key == "max_total_threads_per_threadgroup":
            try:
                n = int(arg, 0)
            except ValueError:
                continue  # a template's expression: the executor checks each dispatch
            if not 0 < n <= MAX_THREADS_PER_THREADGROUP:
                out.append(f"[[max_total_threads_per_threadgroup({n})]]: Apple GPUs run 1 to "
                           f"{MAX_THREADS_PER_THREADGROUP} threads per threadgroup")
    return [strict.Violation(strict._short(where[0]), where[1], "resource-limit", f"kernel '{kernel.name}': {m}")
            for m in out]


def _allocation_rules(kernel, text, code, at) -> list[strict.Violation]:
    """At most 31 threadgroup allocations (variables and [[threadgroup(n)]] buffers)."""
    decls = src.threadgroup_decls(text[kernel.start : kernel.end], code[kernel.start : kernel.end], lenient=True)
    buffers = sum(1 for _, _, attrs in kernel.param_list() for a, _ in attrs if a == "threadgroup")
    if len(decls) + buffers <= MAX_THREADGROUP_ALLOCATIONS:
        return []
    f, ln = at(kernel.start + decls[max(0, MAX_THREADGROUP_ALLOCATIONS - buffers)].start)
    return [strict.Violation(strict._short(f), ln, "threadgroup-memory",
                             f"kernel '{kernel.name}' has {len(decls) + buffers} threadgroup allocations; "
                             f"a kernel has at most {MAX_THREADGROUP_ALLOCATIONS}")]


def _declares_main(code: str, pos: int) -> bool:
    """Whether `main(` at pos declares a function (a type before it), not a call."""
    before = code[:pos].rstrip()
    return bool(re.search(r"[\w>*&]$", before)) and not re.search(r"(?:\breturn|[.:]|->)$", before)


def kernel_rules(text: str) -> list[strict.Violation]:
    """The source rules above on a scanned unit."""
    from . import opencl

    at = strict.Locator(text)
    code = strict._code_only(text)
    out = []
    for m in re.finditer(r"\bmain\s*\(", code):
        if not _declares_main(code, m.start()):
            continue
        f, ln = at(m.start())
        out.append(strict.Violation(strict._short(f), ln, "main", "an MSL function cannot be named main"))
    for k in opencl.kernel_defs(text):
        out += _index_rules(k, at) + _builtin_rules(k, at) + _binding_rules(k, at) + _allocation_rules(k, text, code, at)
    return out


# ------------------------------------------------------------ the AST

_FUNCTIONS = {"FunctionDecl", "CXXMethodDecl", "CXXConstructorDecl", "CXXConversionDecl", "CXXDestructorDecl"}


class _Walker:
    """clang's JSON AST of the unit, read for the functions defined in it (not
    the prelude): each node's offset in the unit, the call graph and the
    calls' control context."""

    def __init__(self, ast: dict, unit_text: str):
        self.at = strict.Locator(unit_text)
        self.file = ""
        self.functions: dict[str, dict] = {}  # id -> FunctionDecl node with a body
        self.patterns: set[str] = set()  # functions of templates' patterns (their instantiations are checked)
        self.constants: dict[str, dict] = {}  # constexpr variable id -> its initialiser
        self.names: dict[str, str] = {}
        self.later: dict[str, str] = {}  # declaration id -> its next redeclaration
        for top in ast.get("inner", []):
            self._collect(top)

    def resolve(self, fid: str) -> str:
        """The definition of a function named by any of its declarations."""
        seen = set()
        while fid not in self.functions and fid in self.later and fid not in seen:
            seen.add(fid)
            fid = self.later[fid]
        return fid

    def offset(self, node: dict) -> int | None:
        """Offset of a node in the unit, or None where it is in a header."""
        loc = node.get("range", {}).get("begin") or node.get("loc") or {}
        loc = loc.get("expansionLoc", loc)
        return loc.get("offset") if loc.get("mh_stdin") else None

    def _mark(self, node) -> None:
        """Fills in the file of every location (the JSON names a file only
        where it changes, in document order)."""
        if isinstance(node, dict):
            if "offset" in node:
                self.file = node.get("file", self.file)
                node["mh_stdin"] = self.file in ("<stdin>", "-")
            for v in node.values():
                if isinstance(v, (dict, list)):
                    self._mark(v)
        elif isinstance(node, list):
            for v in node:
                self._mark(v)

    def _collect(self, node: dict) -> None:
        self._mark(node)
        self._find(node, False)

    def _find(self, node: dict, pattern: bool) -> None:
        """pattern: inside a template's own definition (not an instantiation
        of it), where values of template parameters are unknown."""
        kind = node.get("kind")
        if kind in _FUNCTIONS and node.get("id"):
            self.names[node["id"]] = node.get("name", "?")
            if "previousDecl" in node:
                self.later[node["previousDecl"]] = node["id"]
            body = next((c for c in node.get("inner", []) if c.get("kind") == "CompoundStmt"), None)
            if body is not None and self.offset(node) is not None:
                self.functions[node["id"]] = node
                if pattern:
                    self.patterns.add(node["id"])
        if kind == "VarDecl" and node.get("constexpr") and node.get("inner"):
            self.constants[node["id"]] = node["inner"][-1]
        first = True
        for c in node.get("inner", []):
            if not isinstance(c, dict):
                continue
            inner = pattern
            if kind == "ClassTemplateDecl" and c.get("kind") == "CXXRecordDecl":
                inner = True
            elif kind == "ClassTemplatePartialSpecializationDecl":
                inner = True
            elif kind == "FunctionTemplateDecl" and c.get("kind") in _FUNCTIONS:
                inner, first = pattern or first, False  # the first is the pattern, then its instantiations
            self._find(c, inner)

    def where(self, node: dict) -> tuple[str, int]:
        off = self.offset(node)
        f, ln = self.at(off) if off is not None else ("<prelude>", 0)
        return strict._short(f), ln


def _callee(node: dict) -> tuple[str, str] | None:
    """(id, name) of the function a DeclRefExpr or MemberExpr names."""
    if node.get("kind") == "DeclRefExpr":
        ref = node.get("referencedDecl", {})
        if ref.get("kind") in _FUNCTIONS:
            return ref["id"], ref.get("name", "?")
    elif node.get("kind") == "MemberExpr" and "referencedMemberDecl" in node:
        return node["referencedMemberDecl"], node.get("name", "?")
    return None


def _calls(node: dict, w: "_Walker | None" = None):
    """(callee id, name, node) of every call or function reference under
    node, the callee resolved to its definition where `w` is given."""
    stack = [node]
    while stack:
        n = stack.pop()
        c = _callee(n)
        if c:
            yield (w.resolve(c[0]) if w else c[0]), c[1], n
        stack.extend(x for x in reversed(n.get("inner", [])) if isinstance(x, dict))


def _recursion(w: _Walker) -> list[strict.Violation]:
    graph = {f: [(c, name, n) for c, name, n in _calls(node, w) if c in w.functions]
             for f, node in w.functions.items()}
    out, done = [], set()
    for start in sorted(graph, key=lambda f: w.offset(w.functions[f]) or 0):
        # A path from start back to itself: depth-first, remembering the way.
        stack, seen = [(start, [])], {start}
        while stack:
            f, path = stack.pop()
            for c, name, n in graph[f]:
                if c == start:
                    cycle = [w.names[start]] + [w.names[g] for g, _ in path] + [w.names[start]]
                    call = (path[0][1] if path else n)
                    v = strict.Violation(*w.where(call), "recursion",
                                         f"recursive call ({' -> '.join(cycle)}); MSL functions do not recurse "
                                         "before Metal 2.4")
                    key = frozenset([start] + [g for g, _ in path])
                    if key not in done:
                        done.add(key)
                        out.append(v)
                elif c not in seen:
                    seen.add(c)
                    stack.append((c, path + [(c, n)]))
    return out


# ------------------------------------------------------------ uniform control flow

# What varies between the threads of a threadgroup (g), of a simdgroup (s)
# and of a quad (q), by built-in input.
# g: differs between the simdgroups of a threadgroup; s, q: within a
# simdgroup, a quad. A value of the lane alone (the lane index, the index in
# the quad) is the same pattern in every simdgroup: not g. Apple GPUs count a
# threadgroup barrier per simdgroup (MLX's gemv synchronises from the lanes
# with thrN == 0 of each simdgroup), so only g splits a barrier.
_VARIES = {
    "thread_position_in_grid": "gsq", "thread_position_in_threadgroup": "gsq", "thread_index_in_threadgroup": "gsq",
    "thread_index_in_simdgroup": "sq", "thread_index_in_quadgroup": "q",
    "simdgroup_index_in_threadgroup": "g", "quadgroup_index_in_threadgroup": "gs",
}
# Collectives: the group whose threads must all reach them (the letter of
# _VARIES that must not control them). Only threadgroup barriers: MSL
# defines its simd- and quad-group functions over the threads active at the
# call (MLX's dot.h reduces in the first lanes of a simdgroup only); the
# executor's `strict` option still wants every lane there.
_COLLECTIVE = [
    ("g", re.compile(r"threadgroup_barrier$")),
]
# What a library call's result differs between, from what its arguments
# differ between (`args`: their taint, by position):
# - a reduction, vote or broadcast of the first lane is one value per
#   simdgroup (quad), whatever its argument;
# - a broadcast or shuffle from a lane index gives every lane the value of
#   that lane: one value per simdgroup (quad) where the index is, else any;
# - a relative shuffle moves values between lanes: as different as its data;
# - prefix operations, lane queries and atomics differ between every thread;
# - other functions (maths) are as different as their arguments.
_PER_GROUP = re.compile(r"(?:__metal_)?simd_(?:sum|product|min|max|and|or|xor|all|any|ballot|broadcast_first"
                        r"|active_threads_mask)$")
_PER_QUAD = re.compile(r"(?:__metal_)?quad_(?:sum|product|min|max|and|or|xor|all|any|ballot|broadcast_first"
                       r"|active_threads_mask)$")
_FROM_LANE = re.compile(r"(?:__metal_)?(simd|quad)_(?:broadcast|shuffle)$")
_MOVES = re.compile(r"(?:__metal_)?(?:simd|quad)_shuffle_(?:xor|up|down|rotate_up|rotate_down|and_fill_up"
                    r"|and_fill_down)$")
_PER_THREAD = re.compile(r"atomic_\w+$")
_PER_LANE = re.compile(r"(?:__metal_)?(?:simd|quad)_(?:prefix_\w+|is_first)$|__metal_get_thread_index_in_simdgroup$")


def _call_taint(name: str, args: list[set]) -> set:
    """Taint of a library call's result (see above); markers of helper
    parameters in the arguments that decide it are kept."""
    if _PER_GROUP.match(name):
        return {"g"}
    if _PER_QUAD.match(name):
        return {"g", "s"}
    m = _FROM_LANE.match(name)
    if m:
        lane = args[1] if len(args) > 1 else set()
        inner = "s" if m.group(1) == "simd" else "q"
        base = {"g"} if inner == "s" else {"g", "s"}
        return base | ({"g", "s", "q"} if inner in lane else set()) | {t for t in lane if len(t) > 1}
    if _MOVES.match(name):
        data = set().union(*args[:2]) if args else set()
        return data | ({"g"} if data else set())
    if _PER_THREAD.match(name):
        return {"g", "s", "q"}
    if _PER_LANE.match(name):
        return {"s", "q"} | set().union(*args) if args else {"s", "q"}
    return set().union(*args) if args else set()


def _collective(name: str) -> str:
    return next((g for g, rx in _COLLECTIVE if rx.match(name)), "")


_BRANCHES = {"IfStmt", "SwitchStmt", "ConditionalOperator", "BinaryConditionalOperator"}
_LOOPS = {"ForStmt", "WhileStmt", "DoStmt", "CXXForRangeStmt"}


_ARITHMETIC = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: int(a / b) if b else None, "%": lambda a, b: a - b * int(a / b) if b else None,
    "<<": lambda a, b: a << b, ">>": lambda a, b: a >> b, "&": lambda a, b: a & b, "|": lambda a, b: a | b,
    "^": lambda a, b: a ^ b, "<": lambda a, b: int(a < b), ">": lambda a, b: int(a > b),
    "<=": lambda a, b: int(a <= b), ">=": lambda a, b: int(a >= b), "==": lambda a, b: int(a == b),
    "!=": lambda a, b: int(a != b),
}


def _constant(n: dict, constants: dict[str, dict], depth: int = 0) -> int | None:
    """The value of an integral constant expression of an instantiation
    (literals, template arguments, constexpr variables and the operators
    between them), or None where it is not one: a branch on it is decided
    at compile time (MLX's `if (needs_tgp_reduction)` with BM = 1)."""
    if depth > 40:
        return None
    k = n.get("kind")
    kids = _children(n)
    if k == "ConstantExpr" and "value" in n:
        k, n = "IntegerLiteral", n
    if k == "IntegerLiteral":
        v = n.get("value")
        return int(v) if isinstance(v, str) and re.fullmatch(r"-?\d+", v) else None
    if k == "CXXBoolLiteralExpr":
        return int(bool(n.get("value")))
    if k in ("ImplicitCastExpr", "ParenExpr", "ConstantExpr", "CStyleCastExpr", "CXXStaticCastExpr",
             "CXXFunctionalCastExpr", "SubstNonTypeTemplateParmExpr") and kids:
        if k != "SubstNonTypeTemplateParmExpr" and n.get("castKind") not in (
                None, "NoOp", "IntegralCast", "IntegralToBoolean", "LValueToRValue"):
            return None
        v = _constant(kids[-1], constants, depth + 1)
        if v is not None and n.get("type", {}).get("qualType") == "bool":
            v = int(bool(v))
        return v
    if k == "DeclRefExpr":
        init = constants.get(n.get("referencedDecl", {}).get("id"))
        return _constant(init, constants, depth + 1) if init is not None else None
    if k == "UnaryOperator" and kids:
        v = _constant(kids[0], constants, depth + 1)
        op = n.get("opcode")
        return None if v is None else {"!": int(not v), "-": -v, "+": v, "~": ~v}.get(op)
    if k == "BinaryOperator" and len(kids) == 2:
        a = _constant(kids[0], constants, depth + 1)
        op = n.get("opcode")
        if op in ("&&", "||") and a is not None and bool(a) == (op == "||"):
            return int(bool(a))
        b = _constant(kids[1], constants, depth + 1)
        if a is None or b is None:
            return None
        if op in ("&&", "||"):
            return int(bool(b))
        f = _ARITHMETIC.get(op)
        return f(a, b) if f else None
    if k == "ConditionalOperator" and len(kids) == 3:
        c = _constant(kids[0], constants, depth + 1)
        return None if c is None else _constant(kids[1] if c else kids[2], constants, depth + 1)
    return None


def _accesses_local(node: dict, shallow: bool = False) -> bool:
    """Whether node (or, not shallow, anything under it) names threadgroup
    memory (an lvalue of OpenCL __local type; a pointer to it does not)."""
    stack = [node]
    while stack:
        x = stack.pop()
        t = x.get("type", {}).get("qualType", "")
        if x.get("valueCategory") == "lvalue" and t.startswith("__local") and not t.rstrip().endswith("*"):
            return True
        if not shallow:
            stack.extend(_children(x))
    return False


def _orders_nothing(call: dict) -> bool:
    """Whether a barrier call's flags are mem_flags::mem_none."""
    args = _children(call)[1:]
    names = [x.get("referencedDecl", {}).get("name") for a in args for x in _walk(a)
             if x.get("kind") == "DeclRefExpr"]
    return bool(args) and names == ["mem_none"]


def _walk(n: dict):
    stack = [n]
    while stack:
        x = stack.pop()
        yield x
        stack.extend(_children(x))


def _is_kernel(node: dict) -> bool:
    return any(c.get("kind") in ("OpenCLKernelAttr", "DeviceKernelAttr")  # clang < 21, >= 21
               for c in node.get("inner", []) if isinstance(c, dict))


def _children(n: dict) -> list[dict]:
    return [c for c in n.get("inner", []) if isinstance(c, dict)]


class _Uniformity:
    """Which values differ between the threads of a group, then every
    collective checked against the conditions that control it.

    A taint is a set of letters (g, s, q: differs within a threadgroup,
    simdgroup, quad) and, inside a helper, markers of the helper's own
    parameters: a helper's result is summarised in terms of its parameters
    and resolved at each call; what a helper's parameters may receive
    (`actual`) is gathered over every call."""

    def __init__(self, w: _Walker, builtins: dict[str, dict[str, str]]):
        self.w = w
        self.taint: dict[str, set] = defaultdict(set)  # decl id -> letters and markers
        self.returns: dict[str, set] = defaultdict(set)  # function id -> taint of its result
        self.actual: dict[str, set] = defaultdict(set)  # helper parameter id -> letters it may receive
        self.vectors: dict[str, str] = {}  # vector built-in parameter id -> attribute
        self.params: dict[str, list[str]] = {}
        for f, node in w.functions.items():
            kernel = builtins.get(node.get("name", "")) if _is_kernel(node) else None
            self.params[f] = []
            for c in _children(node):
                if c.get("kind") != "ParmVarDecl":
                    continue
                self.params[f].append(c["id"])
                if kernel is None:
                    self.taint[c["id"]] = {"p" + c["id"]}
                elif c.get("name") in kernel:
                    attr = kernel[c["name"]]
                    self.taint[c["id"]] = set(_VARIES[attr])
                    if re.search(r"\d$", c.get("type", {}).get("qualType", "")):
                        self.vectors[c["id"]] = attr
        self.kinds = self._collective_kinds()
        self.local = self._touches_local()
        for _ in range(50):  # to a fixed point
            size = self._size()
            for f, node in w.functions.items():
                if f not in w.patterns:
                    self._propagate(f, node)
            if size == self._size():
                break

    def _size(self) -> int:
        return sum(len(v) for d in (self.taint, self.returns, self.actual) for v in d.values())

    def _collective_kinds(self) -> dict[str, set]:
        """The collective groups each defined function reaches, transitively."""
        kinds = {f: set() for f in self.w.functions}
        for _ in range(len(kinds) + 1):
            changed = False
            for f, node in self.w.functions.items():
                for c, name, _ in _calls(node, self.w):
                    new = self._groups_of(c, name) | kinds.get(c, set())
                    if not new <= kinds[f]:
                        kinds[f] |= new
                        changed = True
            if not changed:
                break
        return kinds

    def _touches_local(self) -> set:
        """The functions that read or write threadgroup memory, themselves or
        through a call."""
        out = {f for f, node in self.w.functions.items() if _accesses_local(node)}
        changed = True
        while changed:
            changed = False
            for f, node in self.w.functions.items():
                if f not in out and any(c in out for c, _, _ in _calls(node, self.w)):
                    out.add(f)
                    changed = True
        return out

    def _live(self, n: dict) -> list[dict]:
        """n's children that can run: a branch on a constant runs one side."""
        kids = _children(n)
        if n.get("kind") in ("IfStmt", "ConditionalOperator") and not n.get("hasVar"):
            t, parts = self._condition(n)
            cond = next((c for c in kids if not any(c is p for p in parts)), None)
            v = _constant(cond, self.w.constants) if cond is not None else None
            if v is not None:
                branches = [c for c in parts if c.get("kind") != "DeclStmt"]
                keep = branches[0] if v else (branches[1] if len(branches) > 1 else None)
                return [c for c in kids if c is cond or c is keep or c.get("kind") == "DeclStmt"]
        return kids

    def _clean(self, nodes: list[dict], barriers: bool = True) -> bool:
        """Whether running nodes touches no threadgroup memory and (with
        barriers) reaches no threadgroup barrier."""
        stack = list(nodes)
        while stack:
            x = stack.pop()
            if _accesses_local(x, shallow=True):
                return False
            c = _callee(x)
            if c is not None:
                fid = self.w.resolve(c[0])
                if fid in self.local or (barriers and "g" in self._groups_of(fid, c[1]) | self.kinds.get(fid, set())):
                    return False
            stack.extend(self._live(x))
        return True

    def _groups_of(self, fid: str, name: str) -> set:
        """The group a library collective needs (none for the unit's own functions)."""
        return set() if fid in self.w.functions else set(_collective(name))

    def letters(self, t: set) -> set:
        """A taint with the markers replaced by what the parameters may receive."""
        out = {x for x in t if len(x) == 1}
        for x in t:
            if len(x) > 1:
                out |= self.actual.get(x[1:], set())
        return out

    def expr(self, n: dict) -> set:
        out: set = set()
        stack = [n]
        while stack:
            x = stack.pop()
            k = x.get("kind")
            kids = _children(x)
            if k == "DeclRefExpr":
                out |= self.taint.get(x.get("referencedDecl", {}).get("id"), set())
            elif k == "ExtVectorElementExpr" and self._vector_of(x) is not None:
                # threadgroups here are 32 or more threads wide: y and z
                # positions are shared by a simdgroup and a quad
                attr = self.vectors[self._vector_of(x)]
                out |= set(_VARIES[attr]) if "x" in x.get("name", "") else {"g"}
                continue
            elif k in ("CallExpr", "CXXOperatorCallExpr"):
                callee = next(iter(_calls(x, self.w)), None)
                if callee and callee[0] in self.params:  # a helper: its summary, at these arguments
                    args = kids[1:]
                    summary = self.returns.get(callee[0], set())
                    out |= {t for t in summary if len(t) == 1}
                    for pid, arg in zip(self.params[callee[0]], args):
                        if "p" + pid in summary:
                            out |= self.expr(arg)
                    continue
                if callee:  # a library function: its result from its arguments
                    out |= _call_taint(callee[1], [self.expr(a) for a in kids[1:]])
                    continue
            stack.extend(kids)
        return out

    def _vector_of(self, x: dict) -> str | None:
        kids = _children(x)
        while kids and kids[0].get("kind") in ("ImplicitCastExpr", "ParenExpr"):
            kids = _children(kids[0])
        if kids and kids[0].get("kind") == "DeclRefExpr":
            pid = kids[0].get("referencedDecl", {}).get("id")
            return pid if pid in self.vectors else None
        return None

    def _propagate(self, f: str, node: dict) -> None:
        stack = [node]
        while stack:
            x = stack.pop()
            k = x.get("kind")
            kids = _children(x)
            if k == "VarDecl" and kids:
                self.taint[x["id"]] |= self.expr(kids[-1])
            elif k in ("BinaryOperator", "CompoundAssignOperator") and x.get("opcode", "").endswith("=") \
                    and x.get("opcode") not in ("==", "!=", "<=", ">=") and len(kids) == 2:
                base = self._assigned(kids[0])
                if base:
                    self.taint[base] |= self.expr(kids[1]) | self.expr(kids[0])
            elif k == "ReturnStmt" and kids:
                self.returns[f] |= self.expr(kids[0])
            elif k in ("CallExpr", "CXXMemberCallExpr", "CXXOperatorCallExpr"):
                callee = next(iter(_calls(x, self.w)), None)
                if callee and callee[0] in self.params:
                    for pid, arg in zip(self.params[callee[0]], kids[1:]):
                        self.actual[pid] |= self.letters(self.expr(arg))
            stack.extend(kids)

    def _assigned(self, lhs: dict) -> str | None:
        """The thread-private variable an assignment writes, if any (a store
        to device or threadgroup memory taints no variable)."""
        while lhs.get("kind") in ("ImplicitCastExpr", "ParenExpr", "ArraySubscriptExpr", "MemberExpr",
                                  "ExtVectorElementExpr"):
            kids = _children(lhs)
            if not kids:
                return None
            base = kids[0].get("type", {}).get("qualType", "")
            if lhs.get("kind") == "ArraySubscriptExpr" and re.search(r"__(?:global|local)", base):
                return None
            lhs = kids[0]
        if lhs.get("kind") == "DeclRefExpr":
            ref = lhs.get("referencedDecl", {})
            if not re.search(r"__(?:global|local|constant)", ref.get("type", {}).get("qualType", "")):
                return ref.get("id")
        return None

    def _finishing(self) -> dict[str, bool]:
        """Functions a thread finishes its kernel in: kernels, and helpers
        whose every call is the last statement of a function that finishes
        (MLX's kernels end by calling `kernel_t::run(...)`): a return there
        ends the thread. Each with whether threads reach it having touched
        no threadgroup memory (nothing before the calls does)."""
        tails: dict[str, set] = defaultdict(set)  # callee -> callers that call it last
        before: dict[tuple[str, str], bool] = {}  # (caller, callee): the caller's code before the call is clean
        others: set = set()  # callees called elsewhere
        for f, node in self.w.functions.items():
            if f in self.w.patterns:
                continue
            body = next((c for c in reversed(_children(node)) if c.get("kind") == "CompoundStmt"), None)
            kids = _children(body) if body is not None else []
            last = kids[-1] if kids else None
            while last is not None and last.get("kind") in ("ReturnStmt", "ExprWithCleanups", "ImplicitCastExpr"):
                inner = _children(last)
                last = inner[0] if inner else None
            tail = next(iter(_calls(last, self.w)), None) if last is not None and last.get("kind") in (
                "CallExpr", "CXXMemberCallExpr") else None
            for c, _, n in _calls(node, self.w):
                if tail is not None and n is tail[2] and c == tail[0]:
                    tails[c].add(f)
                    before[f, c] = self._clean(kids[:-1] + _children(last)[1:], barriers=False)
                else:
                    others.add(c)
        done = {f: True for f, node in self.w.functions.items() if _is_kernel(node) and f not in self.w.patterns}
        changed = True
        while changed:
            changed = False
            for c, callers in tails.items():
                if c not in done and c not in others and callers <= done.keys():
                    done[c] = all(done[f] and before[f, c] for f in callers)
                    changed = True
        return done

    def violations(self) -> list[strict.Violation]:
        out: list[strict.Violation] = []
        finishing = self._finishing()
        for f, node in self.w.functions.items():
            if f not in self.w.patterns:
                self._visit(node, [], out, f in finishing, finishing.get(f, False))
        return out

    def _condition(self, n: dict) -> tuple[set, list[dict]]:
        """Taint of what decides whether and how often n's parts run, and its parts."""
        kids = _children(n)
        k = n.get("kind")
        if k in _LOOPS:
            body = kids[0] if k == "DoStmt" else kids[-1]
            heads = [c for c in kids if c is not body]
            return set().union(set(), *(self.expr(c) for c in heads)), [body]
        cond = next((c for c in kids if c.get("kind") not in ("DeclStmt", "NullStmt", None)), None)
        return (self.expr(cond) if cond else set()), [c for c in kids if c is not cond]

    def _exits(self, n: dict, kinds: tuple[str, ...]) -> set:
        """Taint of the conditions under which n's statements return (or,
        with Break/ContinueStmt in kinds, leave the loop n is the body of)."""
        out: set = set()
        stack = [(n, frozenset(), kinds)]
        while stack:
            x, path, ks = stack.pop()
            k = x.get("kind")
            if k in ks:
                out |= path
            if k in _LOOPS or k == "SwitchStmt":  # they own the breaks (and loops the continues) inside
                ks = tuple(c for c in ks if c == "ReturnStmt" or (k == "SwitchStmt" and c == "ContinueStmt"))
            if (k in _BRANCHES or k in _LOOPS) and len(self._live(x)) == len(_children(x)):
                t, parts = self._condition(x)
                stack.extend((c, path | t, ks) for c in parts)
            else:
                stack.extend((c, path, ks) for c in self._live(x))
        return out

    def _visit(self, n: dict, controls: list[tuple[set, dict, str]], out: list, kernel: bool,
               clean: bool) -> None:
        """Walks n with the conditions in force, checking each collective.
        A control is (taint, node, what the threads it turns away do):
        "returned": they returned from their kernel, and Apple GPUs release
        finished threads from threadgroup barriers (MLX's reductions return
        early, then synchronise the rest), so such a return splits a
        threadgroup's later barriers no more. "clean": a branch or loop of
        a kernel that touches no threadgroup memory outside it and reaches
        no barrier after it (`clean`): the threads it turns away share
        nothing with the others and go on to finish, so a barrier inside
        that orders no memory (mem_none: one for speed, as in MLX's gemv_t,
        whose simdgroups past the output's end skip its loop) waits for no
        one it could mislead; a barrier that orders memory there still
        wants every thread (the MSL rule). A helper's return splits them
        (its threads go on in the caller), and a branch decided at compile
        time runs only its taken side."""
        k = n.get("kind")
        kids = self._live(n)
        if (k in _BRANCHES or k in _LOOPS) and len(kids) == len(_children(n)):
            t, parts = self._condition(n)
            if k in _LOOPS:  # a divergent break splits the later iterations (a continue, the rest of one)
                t = t | self._exits(parts[0], ("BreakStmt",))
                inner = [(t, n, "clean" if clean else "")]
                r = self._exits(parts[0], ("ReturnStmt",))
                if r:
                    inner.append((r, n, "returned" if kernel else ""))
                for c in kids:
                    into = any(c is x for x in parts)
                    self._visit(c, controls + inner if into else controls, out, kernel, False if into else clean)
                return
            for c in kids:
                if not any(c is x for x in parts):
                    self._visit(c, controls, out, kernel, clean)
                    continue
                others = clean and k != "SwitchStmt" and self._clean([x for x in parts if x is not c])
                self._visit(c, controls + [(t, n, "clean" if others else "")], out, kernel, clean)
            return
        if k == "BinaryOperator" and n.get("opcode") in ("&&", "||") and len(kids) == 2:
            self._visit(kids[0], controls, out, kernel, clean)
            self._visit(kids[1], controls + [(self.expr(kids[0]), n, "")], out, kernel, clean)
            return
        if k == "CompoundStmt":  # after a divergent return or continue, the rest runs in fewer threads
            for i, c in enumerate(kids):
                self._visit(c, controls, out, kernel,
                            clean and self._clean(kids[i + 1:]) and self._clean(kids[:i], barriers=False))
                t = self._exits(c, ("ReturnStmt",))
                if t:
                    controls = controls + [(t, c, "returned" if kernel else "")]
                t = self._exits(c, ("ContinueStmt",))
                if t:
                    controls = controls + [(t, c, "")]
            return
        if k in ("CallExpr", "CXXMemberCallExpr"):
            callee = next(iter(_calls(n, self.w)), None)
            if callee:
                bare = callee[0] not in self.w.functions and _orders_nothing(n)
                for g in sorted(self._groups_of(callee[0], callee[1]) | self.kinds.get(callee[0], set())):
                    cond = next((c for t, c, away in controls if g in self.letters(t) and not (
                        g == "g" and (away == "returned" or (away == "clean" and bare)))), None)
                    if cond is not None:
                        self._report(n, callee[1], g, cond, out)
        for c in kids:
            self._visit(c, controls, out, kernel, clean)

    def _report(self, call: dict, name: str, group: str, cond: dict, out: list) -> None:
        f, ln = self.w.where(call)
        cl = self.w.where(cond)[1]
        who = {"g": "threadgroup", "s": "simdgroup", "q": "quad"}[group]
        v = strict.Violation(f, ln, "uniform-control",
                             f"{name} is reached under a condition that differs between the threads of a {who} "
                             f"(line {cl}); every thread of the {who} must reach it")
        if v not in out:
            out.append(v)


# A pointer or reference to a function, as a variable, parameter, field or
# result type (MSL 1.4.4 has function pointers only to [[visible]]
# functions, from Metal 2.3, which the harness does not model); a function
# as a template argument (a non-type template parameter) is resolved at
# compile time and allowed (MLX's FFT codelets).
_FUNCTION_POINTER = re.compile(r"\(\s*(?:__\w+\s*)*(?:[\w:]+::\s*)?[*&]+\s*(?:const\s*|__\w+\s*)*\)\s*\(")


def _function_pointers(w: _Walker, ast: dict) -> list[strict.Violation]:
    out = []
    for n in _walk(ast):
        if n.get("kind") not in ("VarDecl", "ParmVarDecl", "FieldDecl", "FunctionDecl", "CXXMethodDecl"):
            continue
        t = n.get("type", {})
        qual = t.get("desugaredQualType", t.get("qualType", ""))
        if n["kind"] in ("FunctionDecl", "CXXMethodDecl"):
            qual = qual.split("(", 1)[0] + "(" if "(" in qual else ""  # the result type only
        if _FUNCTION_POINTER.search(qual) and w.offset(n) is not None:
            v = strict.Violation(*w.where(n), "function-pointer",
                                 f"{n.get('name', 'a declaration')} has a pointer or reference to a function "
                                 f"({qual}); MSL has function pointers only to [[visible]] functions")
            if v not in out:
                out.append(v)
    return out


# The restrictions of MSL before 2.4 include recursive calls; from 2.4 the
# specification lists none (MLX's utils.h recurses in LoopedElemToLoc::next).
RECURSION_ALLOWED_FROM = 240


def ast_rules(ast: dict, unit, version: int = 310) -> list[strict.Violation]:
    """Recursion (below Metal 2.4) and uniform control flow on clang's AST of
    an opencl.Unit."""
    w = _Walker(ast, unit.text)
    builtins = {
        name: {pname: a for _, pname, attrs in k.param_list() for a, _ in attrs if a in _VARIES}
        for name, (k, _) in unit.kernels.items()
    }
    recursion = _recursion(w) if version < RECURSION_ALLOWED_FROM else []
    return _function_pointers(w, ast) + recursion + _Uniformity(w, builtins).violations()
