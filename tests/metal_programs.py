"""Run a route's Metal program (the kernels, shapes and bindings eval_gpu
encodes) on the primitive's own inputs: on Linux through the CPU harness, on
a Mac with Metal through the primitive itself on the GPU.

The program comes from ``_ext.metal_program`` and the inputs from
``_ext.conv_inputs``/``_ext.weight_grad_inputs``: the same C++ code paths a
Mac runs. Each run is recorded in the route log with backend
``metal-harness`` or ``metal``.
"""

from __future__ import annotations

import sys

import numpy as np
import mlx.core as mx

from mlx_lattice import _ext, diagnostics

import metal_harness


def _backend() -> tuple[str | None, str]:
    if sys.platform == "darwin":
        if mx.metal.is_available() and _ext.metal_available():
            return "metal", ""
        return None, "macOS without Metal or without a Metal build of mlx_lattice"
    ok, why = metal_harness.available()
    return ("metal-harness", "") if ok else (None, why)


BACKEND, WHY = _backend()

NP_DTYPES = {"float32": np.float32, "float16": np.float16}


def _np(a: mx.array) -> np.ndarray:
    if a.dtype == mx.bfloat16:
        raise TypeError("the harness has no bfloat16 buffers")
    return np.array(a)


def run_program(program: dict, inputs: list, out_shape, out_dtype: str, schedule="forward", seed=0):
    """Execute every step of a program; returns the output array."""
    ins = [_np(a) for a in inputs]
    # Metal leaves new buffers uninitialised: NaN catches unwritten outputs.
    out = np.full(out_shape, np.nan, dtype=NP_DTYPES[out_dtype])
    temps = [np.full(n, np.nan, dtype=NP_DTYPES[d]) for d, n in program["temps"]]
    for step in program["steps"]:
        buffers, names, params, pidx = [], [], None, None
        for i, (kind, payload, name) in enumerate(step["buffers"]):
            names.append(name)
            if kind == "input":
                buffers.append(ins[payload])
            elif kind == "output":
                buffers.append(out)
            elif kind == "temp":
                buffers.append(temps[payload])
            else:
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
                out = result[i]
            elif kind == "temp":
                temps[payload] = result[i]
    return out


def conv(route: str, x: mx.array, w: mx.array, relation, view=_ext.View.output_major, schedule="forward", seed=0, record=None):
    """The GatherConv primitive's output computed by `route`'s Metal program."""
    inputs = _ext.conv_inputs(x, w, relation, view, route)
    rows = x.shape[0] if relation is None else (relation.n_out if view == _ext.View.output_major else relation.n_in)
    shape = [rows, w.shape[2]]
    dtype = str(x.dtype).replace("mlx.core.", "")
    program = _ext.metal_program("conv", route, inputs, shape, x.dtype)
    if BACKEND == "metal":
        gpu = mx.default_stream(mx.gpu)
        y = np.array(_ext.gather_conv(x, w, relation, view, route, gpu))
        for step in program["steps"]:
            metal_harness.record_ran(step["kernel"], "metal")
    else:
        y = run_program(program, inputs, tuple(shape), dtype, schedule, seed)
    if record is not None:
        entry = dict(record)
        entry.update(route=route, backend=BACKEND, kernels=[s["kernel"] for s in program["steps"]])
        diagnostics.emit(entry)
    return y


def weight_grad(route: str, x: mx.array, ct: mx.array, relation, k: int, view=_ext.View.output_major, schedule="forward", seed=0):
    """The WeightGrad primitive's output (K, A, B) computed by `route`'s Metal program."""
    inputs = _ext.weight_grad_inputs(x, ct, relation, view)
    shape = [k, x.shape[1], ct.shape[1]]
    dtype = str(x.dtype).replace("mlx.core.", "")
    program = _ext.metal_program("weight_grad", route, inputs, shape, x.dtype)
    if BACKEND == "metal":
        gpu = mx.default_stream(mx.gpu)
        for step in program["steps"]:
            metal_harness.record_ran(step["kernel"], "metal")
        return np.array(_ext.weight_grad(x, ct, relation, view, k, route, gpu))
    return run_program(program, inputs, tuple(shape), dtype, schedule, seed)


def quantized(route: str, x: mx.array, q, relation, view=_ext.View.output_major, schedule="forward", seed=0, record=None):
    """The QuantizedConv primitive's output computed by `route`'s Metal program.

    q: a QuantizedWeight (its kernel-major codes, scales and biases are the
    primitive's inputs, as ops pass them).
    """
    codes, scales, biases = q.kernel_major()
    inputs = _ext.quantized_conv_inputs(x, codes, scales, biases, q.bits, q.group_size, relation, view, route)
    rows = x.shape[0] if relation is None else (relation.n_out if view == _ext.View.output_major else relation.n_in)
    shape = [rows, codes.shape[0]]
    dtype = str(x.dtype).replace("mlx.core.", "")
    program = _ext.metal_program("quantized", route, inputs, shape, x.dtype)
    y = run_program(program, inputs, tuple(shape), dtype, schedule, seed)
    if record is not None:
        entry = dict(record)
        entry.update(route=route, backend="metal-harness", kernels=[s["kernel"] for s in program["steps"]])
        diagnostics.emit(entry)
    return y
