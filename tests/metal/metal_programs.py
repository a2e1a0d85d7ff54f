"""What the Metal tests share: the backend probe, the test case builder,
and running a route's Metal program (the kernels, shapes and bindings
eval_gpu encodes) on the primitive's own inputs: on Linux through the CPU
harness, on a Mac with Metal through the primitive itself on the GPU.

The program comes from ``_ext.metal_program`` and the inputs from
``_ext.conv_inputs``/``_ext.weight_grad_inputs``: the same C++ code paths a
Mac runs. Every run writes a route-log record (route, backend
``metal-harness`` or ``metal``, kernels), so ``MLX_LATTICE_ROUTE_LOG`` over
the suite lists every Metal route taken.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import _ext, diagnostics
from mlx_lattice.relation import KernelGeometry

import metal_harness
import oracle


def _backend() -> tuple[str | None, str]:
    if sys.platform == "darwin":
        if mx.metal.is_available() and _ext.metal_available():
            return "metal", ""
        return None, "macOS without Metal or without a Metal build of mlx_lattice"
    ok, why = metal_harness.available()
    return ("metal-harness", "") if ok else (None, why)


# The one backend probe: "metal" (a Mac's GPU), "metal-harness" (CPU
# emulation) or None (WHY says why); MARKS skips a module without one.
BACKEND, WHY = _backend()
MARKS = [pytest.mark.metal, pytest.mark.skipif(BACKEND is None, reason=WHY)]

OUTPUT_MAJOR = _ext.View.output_major
INPUT_MAJOR = _ext.View.input_major


def case(rng, n, c_in, c_out, dtype, kind="submanifold", extent=None, batches=2, targets=None,
         unreachable_target=False, weight_dtype=None):
    """Features, 5D weight, relation, oracle edges and output count.

    kind: submanifold or pointwise (output rows = input rows), forward
    (stride 2) or target (`targets` random outputs, n // 2 by default; with
    `unreachable_target` one more output far from every input). The weight
    has `weight_dtype` (default: dtype).
    """
    extent = extent or max(6, int(round((n / batches * 3) ** (1 / 3))))
    coords = oracle.random_coords(rng, n, extent, batches)
    x = ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32))
    m, s = x.manager, x.coordinate_set
    ks = 1 if kind == "pointwise" else 3
    if kind in ("submanifold", "pointwise"):
        pad = (ks - 1) // 2
        rel = m.submanifold_kernel_relation(s, KernelGeometry((ks,) * 3, (1,) * 3, (pad,) * 3, (1,) * 3))
        out = coords
        edges = oracle.conv_edges(coords, coords, ks, 1, pad)
    elif kind == "forward":
        rel, out_set = m.kernel_relation(s, KernelGeometry((3, 3, 3), (2,) * 3, (1,) * 3, (1,) * 3))
        out = np.array(out_set.coords)
        edges = oracle.conv_edges(coords, out, 3, 2, 1)
    elif kind == "target":
        out = oracle.random_coords(rng, n // 2 if targets is None else targets, extent, batches)
        if unreachable_target:
            out = np.concatenate([out, np.array([[0, 1000, 1000, 1000]], np.int32)])
        dst = m.register(mx.array(out))
        rel = m.target_kernel_relation(s, dst, KernelGeometry((3, 3, 3), (1,) * 3, (1,) * 3, (1,) * 3))
        edges = oracle.conv_edges(coords, out, 3, 1, 1)
    else:
        raise ValueError(f"unknown case kind {kind!r}")
    feats = mx.array(rng.standard_normal((len(coords), c_in)).astype(np.float32)).astype(dtype)
    w5 = mx.array((rng.standard_normal((c_out, ks, ks, ks, c_in)) / np.sqrt(27 * c_in)).astype(np.float32))
    return feats, w5.astype(weight_dtype or dtype), rel, edges, len(out)


def geometry(ks, stride=1, padding=0) -> KernelGeometry:
    return KernelGeometry((ks,) * 3, (stride,) * 3, (padding,) * 3, (1,) * 3)


def relation(rng, kind, n, ks=3, extent=None, batches=2):
    """A relation of any map kind built by the project's manager on random
    coordinates, with the oracle's edges (out row, in row, k) for it:
    (relation, rows of x, output rows, edges).

    submanifold: K = ks^3, centred; forward: stride 2 (ks 2: K = 8; ks 3:
    padding 1); target: n // 2 random outputs and one far from every input;
    transposed: back onto the finer set of a 2x2x2 stride-2 layer (that
    layer's edges swapped); generative: every point a centred kernel reaches.
    """
    extent = extent or max(5, int(round((n / batches * 3) ** (1 / 3))))
    coords = oracle.random_coords(rng, n, extent, batches)
    x = ml.SparseTensor(coords, np.zeros((len(coords), 1), np.float32))
    m, s = x.manager, x.coordinate_set
    pad = (ks - 1) // 2
    if kind == "submanifold":
        rel = m.submanifold_kernel_relation(s, geometry(ks, 1, pad))
        edges = oracle.conv_edges(coords, coords, ks, 1, pad)
        n_out = len(coords)
    elif kind == "forward":
        rel, out_set = m.kernel_relation(s, geometry(ks, 2, pad))
        out = np.array(out_set.coords)
        edges = oracle.conv_edges(coords, out, ks, 2, pad)
        n_out = len(out)
    elif kind == "target":
        out = oracle.random_coords(rng, max(n // 2, 1), extent, batches)
        out = np.concatenate([out, np.array([[0, 500, 500, 500]], np.int32)])
        rel = m.target_kernel_relation(s, m.register(mx.array(out)), geometry(ks, 1, pad))
        edges = oracle.conv_edges(coords, out, ks, 1, pad)
        n_out = len(out)
    elif kind == "transposed":
        g = geometry(2, 2, 0)
        _, coarse = m.kernel_relation(s, g)
        rel, dst = m.transposed_kernel_relation(coarse, g)
        assert dst.id == s.id
        coarse_coords = np.array(coarse.coords)
        edges = oracle.transposed_edges(coarse_coords, coords, 2, 2, 0)
        n_out, coords = len(coords), coarse_coords
    elif kind == "generative":
        rel, out_set = m.generative_relation(s, geometry(ks, 1, pad))
        out = np.array(out_set.coords)
        edges = oracle.transposed_edges(coords, out, ks, 1, pad)
        n_out = len(out)
    else:
        raise ValueError(f"unknown map kind {kind!r}")
    assert rel.kind == kind and rel.n_out == n_out and rel.edges == len(edges)
    return rel, len(coords), n_out, edges


def _rows(x, relation, view) -> int:
    if relation is None:
        return x.shape[0]
    return relation.n_out if view == OUTPUT_MAJOR else relation.n_in


def _record(route: str, program: dict, backend: str, fields: dict | None) -> None:
    entry = dict(fields or {})
    entry.update(route=route, backend=backend, kernels=[s["kernel"] for s in program["steps"]])
    diagnostics.emit(entry)

MX_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def host(a: mx.array) -> np.ndarray:
    """A result as NumPy: bfloat16 (which NumPy lacks) widened to float32,
    exactly."""
    return np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)


def run_program(program: dict, inputs: list, out_shape, out_dtype: str, schedule="forward", seed=0):
    """Execute every step of a program; returns the output array (bfloat16
    widened to float32, see `host`)."""
    dtype = MX_DTYPES[out_dtype]
    ins = [buffer(a) for a in inputs]
    # Metal leaves new buffers uninitialised: NaN catches unwritten outputs.
    out = fresh(out_shape, dtype)
    temps = [fresh(n, MX_DTYPES[d]) for d, n in program["temps"]]
    y = run_steps(program, ins, out, temps, schedule, seed)
    return host(from_buffer(y, dtype))


def run_steps(program: dict, inputs: list, out, temps: list, schedule: str, seed: int):
    """Every step of `program` in the harness on NumPy buffers; returns the
    output. `out` is one buffer, or a list of them for a primitive with
    several outputs (each output binding names its index); the same kind is
    returned."""
    outs = list(out) if isinstance(out, list) else [out]
    for step in program["steps"]:
        buffers, names, params, pidx = [], [], None, None
        for i, (kind, payload, name) in enumerate(step["buffers"]):
            names.append(name)
            if kind == "input":
                buffers.append(inputs[payload])
            elif kind == "output":
                buffers.append(outs[payload])
            elif kind == "temp":
                buffers.append(temps[payload])
            else:
                assert kind == "bytes", kind
                params, pidx = bytes(payload), i
                buffers.append(None)
        kernel = step["kernel"]
        source = metal_harness.defined_kernels()[kernel]
        result = metal_harness.run_kernel(
            source, kernel, buffers, params, groups=step["groups"], threads=step["threads"],
            params_index=pidx, names=names, schedule=schedule, seed=seed,
        )
        # outputs and temporaries come back as new arrays: carry them on
        for i, (kind, payload, _) in enumerate(step["buffers"]):
            if kind == "output":
                outs[payload] = result[i]
            elif kind == "temp":
                temps[payload] = result[i]
    return outs if isinstance(out, list) else outs[0]


def buffer(a: mx.array) -> np.ndarray:
    """An array as the harness binds it (bfloat16 as its uint16 bits)."""
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16))
    return np.array(a)


def fresh(shape, dtype: mx.Dtype) -> np.ndarray:
    """A new buffer as Metal leaves it, uninitialised: NaN everywhere."""
    if dtype == mx.bfloat16:
        return np.full(shape, 0x7FC0, np.uint16)
    return np.full(shape, np.nan, {mx.float32: np.float32, mx.float16: np.float16}[dtype])


def from_buffer(b: np.ndarray, dtype: mx.Dtype) -> mx.array:
    """A harness buffer back as an array of `dtype` (inverse of `buffer`)."""
    a = mx.array(np.ascontiguousarray(b))
    return a.view(mx.bfloat16) if dtype == mx.bfloat16 else a


def conv(route: str, x: mx.array, w: mx.array, relation, view=OUTPUT_MAJOR, schedule="forward", seed=0,
         record=None, groups=1):
    """The GatherConv primitive's output computed by `route`'s Metal program;
    `record`: more fields for its route-log record; `groups` > 1: a grouped
    product (w is (K, A / groups, B))."""
    inputs = _ext.conv_inputs(x, w, relation, view, route, groups=groups)
    shape = [_rows(x, relation, view), w.shape[2]]
    dtype = str(x.dtype).replace("mlx.core.", "")
    program = _ext.metal_program("conv", route, inputs, shape, x.dtype, groups=groups)
    if BACKEND == "metal":
        gpu = mx.default_stream(mx.gpu)
        y = host(_ext.gather_conv(x, w, relation, view, route, gpu, groups=groups))
        for step in program["steps"]:
            metal_harness.record_ran(step["kernel"], "metal")
    else:
        y = run_program(program, inputs, tuple(shape), dtype, schedule, seed)
    direction = "forward" if view == OUTPUT_MAJOR else "dgrad"
    _record(route, program, BACKEND, {"direction": direction, **(record or {})})
    return y


def weight_grad(route: str, x: mx.array, ct: mx.array, relation, k: int, view=OUTPUT_MAJOR, schedule="forward",
                seed=0, record=None, groups=1):
    """The WeightGrad primitive's output (K, A / groups, B) computed by `route`'s Metal program."""
    inputs = _ext.weight_grad_inputs(x, ct, relation, view)
    shape = [k, x.shape[1] // groups, ct.shape[1]]
    dtype = str(x.dtype).replace("mlx.core.", "")
    program = _ext.metal_program("weight_grad", route, inputs, shape, x.dtype, groups=groups)
    if BACKEND == "metal":
        gpu = mx.default_stream(mx.gpu)
        for step in program["steps"]:
            metal_harness.record_ran(step["kernel"], "metal")
        dw = host(_ext.weight_grad(x, ct, relation, view, k, route, gpu, groups=groups))
    else:
        dw = run_program(program, inputs, tuple(shape), dtype, schedule, seed)
    _record(route, program, BACKEND, {"direction": "wgrad", **(record or {})})
    return dw


def quantized(route: str, x: mx.array, q, relation, view=OUTPUT_MAJOR, schedule="forward", seed=0, record=None):
    """The QuantizedConv primitive's output computed by `route`'s Metal program.

    q: a QuantizedWeight (its kernel-major codes, scales and biases are the
    primitive's inputs, as ops pass them).
    """
    codes, scales, biases = q.kernel_major()
    inputs = _ext.quantized_conv_inputs(x, codes, scales, biases, q.bits, q.group_size, relation, view, route)
    shape = [_rows(x, relation, view), codes.shape[0]]
    dtype = str(x.dtype).replace("mlx.core.", "")
    program = _ext.metal_program("quantized", route, inputs, shape, x.dtype)
    y = run_program(program, inputs, tuple(shape), dtype, schedule, seed)
    _record(route, program, "metal-harness", {"direction": "forward", "quantized": True, **(record or {})})
    return y


def device_situations(monkeypatch):
    """Each (GPU default device, MLX runs Metal, build has the Metal
    kernels) of the eight, made so in turn for what the package asks (no
    CUDA; the Metal libraries looked up again each time): the device facts
    the Metal routes' selection reads."""
    import pathlib

    from mlx_lattice import backends
    from mlx_lattice.backends import build

    metal = backends.get("metal")
    monkeypatch.setattr(backends.get("cuda"), "available", lambda: False)
    is_file = pathlib.Path.is_file  # the harness reads its own files
    monkeypatch.setattr(pathlib.Path, "is_file", lambda self: self.suffix == ".metallib" or is_file(self))
    monkeypatch.setattr(build, "package_dir", lambda: pathlib.Path(_ext.__file__).parent)
    for gpu_device in (False, True):
        for on_metal in (False, True):
            for built in (False, True):
                monkeypatch.setattr(mx, "default_device", lambda g=gpu_device: mx.Device(mx.gpu if g else mx.cpu))
                monkeypatch.setattr(metal, "available", lambda m=on_metal: m)
                monkeypatch.setattr(build, "build_info", lambda b=built: {"metal_built": b, "metal_reason": "x"})
                monkeypatch.setattr(_ext, "metal_available", lambda b=built: b)
                build.forget()  # the libraries are looked up once per process: again
                yield gpu_device, on_metal, built
