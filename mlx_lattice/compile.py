"""``mx.compile`` over functions of SparseTensors: ``sparse_compile``.

MLX compiles functions of trees of arrays. A SparseTensor is features (an
array) on a coordinate set whose maps are host-side data built from
concrete coordinates. ``sparse_compile(fn)`` passes each SparseTensor
argument's features to ``mx.compile`` as an input and keeps its coordinate
set out of the trace: the function is traced once per combination of input
coordinate sets (the maps that trace builds or reads are those sets'), and
a call on other coordinates traces again instead of reusing maps captured
for different ones. SparseTensors in the result come back on the
coordinate sets the trace produced. See ``docs/compile.md``.

What cannot be compiled is an op whose output coordinates depend on values
computed inside the function (``prune_by_logits``, ``prune`` with a
computed mask, ``top_k``, ``voxelize`` of computed points, a SparseTensor
built from computed coordinates): those read the values on the host, and
MLX cannot evaluate while tracing. ``sparse_compile`` turns MLX's error into
one that names the op.
"""

from __future__ import annotations

import os
import traceback
from collections import OrderedDict

import mlx.core as mx
import mlx.nn as mnn

from .tensor import SparseTensor

_CONSTANTS = (bool, int, float, str, type(None))
_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_THIS = os.path.abspath(__file__)
_EVAL_IN_TRACE = "Attempting to eval an array during function transformations"


def _split(tree, arrays: list, sets: list, where: str):
    """A hashable description of ``tree`` with its arrays (SparseTensor
    features included) moved to ``arrays`` and its SparseTensors' coordinate
    sets to ``sets``."""
    if isinstance(tree, SparseTensor):
        arrays.append(tree.feats)
        sets.append((tree.coordinate_set, tree.manager))
        return ("sparse", len(arrays) - 1, len(sets) - 1)
    if isinstance(tree, mx.array):
        arrays.append(tree)
        return ("array", len(arrays) - 1)
    if type(tree) in (list, tuple):
        return (type(tree).__name__, tuple(_split(v, arrays, sets, f"{where}[{i}]") for i, v in enumerate(tree)))
    if type(tree) is dict:
        return ("dict", tuple((k, _split(v, arrays, sets, f"{where}[{k!r}]")) for k, v in tree.items()))
    if isinstance(tree, _CONSTANTS):
        return ("constant", tree)
    raise TypeError(
        f"sparse_compile: {where} is a {type(tree).__name__}; a compiled function takes SparseTensors, "
        f"mx.arrays, lists, tuples and dicts of them, and constants (bool, int, float, str, None). "
        f"Capture anything else in the function (it is then a constant of the trace)"
    )


def _build(node, arrays, sets):
    kind = node[0]
    if kind == "sparse":
        cset, manager = sets[node[2]]
        return SparseTensor._from_set(cset, arrays[node[1]], manager)
    if kind == "array":
        return arrays[node[1]]
    if kind == "list":
        return [_build(v, arrays, sets) for v in node[1]]
    if kind == "tuple":
        return tuple(_build(v, arrays, sets) for v in node[1])
    if kind == "dict":
        return {k: _build(v, arrays, sets) for k, v in node[1]}
    return node[1]


def _split_result(tree, arrays: list, sets: list, where: str = "the result"):
    if isinstance(tree, (SparseTensor, mx.array)) or type(tree) in (list, tuple, dict) or tree is None:
        return _split(tree, arrays, sets, where)
    raise TypeError(
        f"sparse_compile: {where} is a {type(tree).__name__}; a compiled function returns SparseTensors, "
        f"mx.arrays, None, or lists, tuples and dicts of them"
    )


class _Trace:
    """One traced function: its input coordinate sets (held, so that their
    ids stay theirs), the compiled function and what its result looks like."""

    __slots__ = ("sets", "compiled", "result", "result_sets")

    def __init__(self, sets):
        self.sets = sets
        self.compiled = None
        self.result = None
        self.result_sets = None


def _public_name(frame) -> str:
    import mlx_lattice

    code = frame.f_code
    rel = os.path.relpath(os.path.abspath(code.co_filename), _PACKAGE)
    qual = code.co_qualname
    if rel.startswith("nn" + os.sep):
        return "nn." + qual.split(".")[0]
    if qual.endswith(".__init__"):
        cls = qual.rsplit(".", 1)[0]
        return f"{cls}(...)" if hasattr(mlx_lattice, cls) else f"mlx_lattice.{cls}(...)"
    if "." not in qual and getattr(mlx_lattice, qual, None) is not None:
        return f"mlx_lattice.{qual}"
    module = os.path.splitext(rel)[0].replace(os.sep, ".")
    return f"mlx_lattice.{module}.{qual}"


def _eval_in_trace_error(error: ValueError) -> ValueError:
    """MLX's error for an evaluation while tracing, naming the op that asked
    for it: the first of the package's frames outside ``nn`` and ``models``
    (the op a layer called), with the innermost layer that called it."""
    frames = [f for f, _ in traceback.walk_tb(error.__traceback__)
              if os.path.abspath(f.f_code.co_filename).startswith(_PACKAGE + os.sep)
              and os.path.abspath(f.f_code.co_filename) != _THIS]
    layer = op = None
    for f in frames:
        rel = os.path.relpath(os.path.abspath(f.f_code.co_filename), _PACKAGE)
        if rel.startswith(("nn" + os.sep, "models" + os.sep)):
            if rel.startswith("nn" + os.sep):
                layer = f
            continue
        op = f
        break
    if op is None and layer is None:
        return ValueError(
            f"sparse_compile: the function evaluates an array computed inside it ({error}); under "
            f"mx.compile nothing may be evaluated while tracing (item(), np.array(), mx.eval of a traced "
            f"value): move that out of the compiled function"
        )
    name = _public_name(op if op is not None else layer)
    where = f" (called by {_public_name(layer)})" if op is not None and layer is not None else ""
    return ValueError(
        f"sparse_compile: {name}{where} cannot run inside a compiled function: it reads values computed "
        f"there on the host (output coordinates that depend on the data, e.g. pruning by logits, a "
        f"computed mask, top-k, or coordinates computed from features), and MLX cannot evaluate while "
        f"tracing (arrays passed to the compiled function are traced values too). Compile the parts "
        f"before and after it separately and call it between them, uncompiled"
    )


class SparseCompiled:
    """The compiled form of a function of SparseTensors (``sparse_compile``)."""

    def __init__(self, fn, inputs=None, outputs=None, cache_size: int = 8):
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        if not isinstance(cache_size, int) or isinstance(cache_size, bool) or cache_size < 1:
            raise ValueError(f"cache_size must be a positive int, got {cache_size!r}")
        if isinstance(fn, mnn.Module):
            # A model's parameters are state, not constants captured at the
            # first trace: later updates and load_weights reach the compiled
            # call, and what the call writes (a training-mode norm's running
            # statistics) comes back as arrays, not as the trace's placeholders.
            inputs = fn.state if inputs is None else inputs
            outputs = fn.state if outputs is None else outputs
        self.fn, self.inputs, self.outputs = fn, inputs, outputs
        self.cache_size = cache_size
        self.traces = 0  # functions traced so far (one per new input coordinate sets)
        self._cache: OrderedDict = OrderedDict()

    def _trace_for(self, key, sets) -> _Trace:
        entry = self._cache.get(key)
        if entry is not None:
            self._cache.move_to_end(key)
            return entry
        entry = _Trace(sets)
        structure = key[0]
        fn = self.fn

        def traced(*arrays):
            args = _build(structure[0], arrays, entry.sets)
            kwargs = _build(structure[1], arrays, entry.sets)
            result = fn(*args, **kwargs)
            out, out_sets = [], []
            entry.result = _split_result(result, out, out_sets)
            entry.result_sets = out_sets
            return tuple(out)

        entry.compiled = mx.compile(traced, inputs=self.inputs, outputs=self.outputs)
        self._cache[key] = entry
        self.traces += 1
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return entry

    def __call__(self, *args, **kwargs):
        arrays: list = []
        sets: list = []
        structure = (_split(args, arrays, sets, "argument"), _split(kwargs, arrays, sets, "keyword argument"))
        # The coordinate sets (by identity) and managers decide the maps a
        # trace builds: they are part of the key, beside the constants.
        key = (structure, tuple((s.id, id(m)) for s, m in sets))
        entry = self._trace_for(key, sets)
        try:
            out = entry.compiled(*arrays)
        except ValueError as e:
            self._cache.pop(key, None)
            if _EVAL_IN_TRACE in str(e):
                raise _eval_in_trace_error(e) from None
            raise
        return _build(entry.result, out, entry.result_sets)

    def clear(self) -> None:
        """Drop every trace (and the coordinate sets they hold)."""
        self._cache.clear()

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        return f"sparse_compile({name}, traces={self.traces}, cached={len(self._cache)})"


def sparse_compile(fn=None, *, inputs=None, outputs=None, cache_size: int = 8):
    """``mx.compile`` for functions that take and return SparseTensors.

    ``fn`` takes SparseTensors, arrays, constants and lists, tuples and
    dicts of them, and returns SparseTensors, arrays or trees of them.
    ``inputs`` / ``outputs`` are ``mx.compile``'s captured state (e.g.
    ``[model.state, opt.state]`` for a training step); an ``mlx.nn.Module``
    compiled without them takes its own ``state`` as both. Each SparseTensor
    argument enters the trace as its features; its coordinates and maps stay
    fixed within a trace, which is made once per combination of input
    coordinate sets (and constants) and kept for the last ``cache_size``
    of them. Results equal the uncompiled function's up to the rounding of
    the element-wise ops MLX fuses (``docs/compile.md``).

        forward = ml.sparse_compile(model)          # model.eval() first
        y = forward(x)                              # a SparseTensor

        state = [model.state, opt.state]

        @partial(ml.sparse_compile, inputs=state, outputs=state)
        def step(x, labels):
            loss, grads = nn.value_and_grad(model, loss_fn)(model, x, labels)
            opt.update(model, grads)
            return loss
    """
    if fn is None:
        return lambda f: SparseCompiled(f, inputs, outputs, cache_size)
    return SparseCompiled(fn, inputs, outputs, cache_size)


__all__ = ["SparseCompiled", "sparse_compile"]
