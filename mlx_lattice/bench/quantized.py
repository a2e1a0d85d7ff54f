"""Quantized against float weights on the CPU (``--quantized``): a 3x3x3
submanifold layer of C -> C channels per channel count, and a MinkUNet
forward pass, each with float, int8 and int4 weights (``group_size=None``:
64 where it divides C_in, else 32), through the public ops as a model
calls them (maps built once, beforehand).

The variants of a case are timed in turns, call by call, and each keeps its
best wall time and best process CPU time: on a machine shared with other
work a slow stretch then costs every variant alike, and CPU time, which
does not count time the process waits for a core, is the steadier figure.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import mlx.core as mx

from .. import _ext, diagnostics, num_threads, ops
from ..quantized import QuantizedWeight
from ..relation import KernelGeometry
from ..tensor import SparseTensor
from .profile import cpu_name
from .workloads import DTYPES, workload

CHANNELS = (32, 64, 128, 256)
VARIANTS = ("float", "int8", "int4")


def interleaved_best(fns: dict, rounds: int, min_time_s: float = 0.0) -> dict:
    """{name: (best wall s, best CPU s)} of each function, called in turns:
    one warm-up call each, then ``rounds`` rounds (more until ``min_time_s``
    of wall time has passed, at most 200)."""
    for fn in fns.values():
        fn()
    best = {k: [float("inf"), float("inf")] for k in fns}
    start = time.perf_counter()
    done = 0
    while done < rounds or (time.perf_counter() - start < min_time_s and done < 200):
        for k, fn in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            w1, c1 = time.perf_counter(), time.process_time()
            best[k][0] = min(best[k][0], w1 - w0)
            best[k][1] = min(best[k][1], c1 - c0)
        done += 1
    return {k: tuple(v) for k, v in best.items()}


def weight_bytes(w) -> int:
    if isinstance(w, QuantizedWeight):
        return w.codes.nbytes + w.scales.nbytes + w.biases.nbytes
    return w.nbytes


def _route(fn) -> str:
    with diagnostics.record() as log:
        fn()
    return log[0]["route"] if len(log) else "?"


def layer_cases(wl: str, coords, channels, dtype_name: str, rounds: int, min_time_s: float) -> list[dict]:
    """One case per (channel count, variant): a submanifold 3x3x3 C -> C layer."""
    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(0)
    cases = []
    for c in channels:
        x = SparseTensor(coords, mx.array(rng.standard_normal((len(coords), c)).astype(np.float32)).astype(dtype))
        w = mx.array((rng.standard_normal((c, 3, 3, 3, c)) / np.sqrt(27 * c)).astype(np.float32)).astype(dtype)
        weights = {"float": w, "int8": QuantizedWeight.from_float(w, bits=8),
                   "int4": QuantizedWeight.from_float(w, bits=4)}
        mx.eval(x.feats, w, *[a for q in weights.values() if isinstance(q, QuantizedWeight)
                              for a in (q.codes, q.scales, q.biases)])
        fns = {k: (lambda wk=wk: mx.eval(ops.subm_conv3d(x, wk).feats)) for k, wk in weights.items()}
        y_float = np.array(ops.subm_conv3d(x, w).feats.astype(mx.float32))
        edges = x.manager.submanifold_kernel_relation(
            x.coordinate_set, KernelGeometry((3,) * 3, (1,) * 3, (1,) * 3, (1,) * 3)).edges
        times = interleaved_best(fns, rounds, min_time_s)
        for k, wk in weights.items():
            y = np.array(ops.subm_conv3d(x, wk).feats.astype(mx.float32))
            cases.append(dict(
                bench="quantized", workload=wl, layer=f"subm3 C{c}", variant=k, dtype=dtype_name, c_in=c, c_out=c,
                n=len(coords), edges=edges, ms=times[k][0] * 1e3, cpu_ms=times[k][1] * 1e3,
                speedup=times["float"][0] / times[k][0], cpu_speedup=times["float"][1] / times[k][1],
                weight_bytes=weight_bytes(wk), weight_ratio=weight_bytes(w) / weight_bytes(wk),
                group_size=getattr(wk, "group_size", 0),
                max_rel_error=float(np.abs(y - y_float).max() / np.abs(y_float).max()),
                route=_route(fns[k]), threads=num_threads(),
            ))
    return cases


def network_cases(wl: str, coords, width: float, dtype_name: str, rounds: int, min_time_s: float) -> list[dict]:
    """MinkUNet(width) forward passes in eval mode, float against the model
    quantized by ``nn.quantize(model, bits)`` (layers no group size fits
    stay float; the case says how many were quantized)."""
    import warnings

    from .. import nn
    from ..models import MinkUNet

    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(0)
    x = SparseTensor(coords, mx.array(rng.standard_normal((len(coords), 4)).astype(np.float32)).astype(dtype))
    models = {}
    for k in VARIANTS:
        mx.random.seed(0)
        m = MinkUNet(4, 3, width=width)
        m.set_dtype(dtype)
        m.eval()
        if k != "float":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", nn.QuantizationWarning)  # the plan below says it
                plan = nn.quantization_plan(m, bits=int(k[3:]))
                nn.quantize(m, bits=int(k[3:]))
            m.quantized_layers = (len(plan.quantized), len(plan.layers))
        mx.eval(m.parameters())
        models[k] = m
    fns = {k: (lambda m=m: mx.eval(m(x).feats)) for k, m in models.items()}
    times = interleaved_best(fns, rounds, min_time_s)
    y_float = np.array(models["float"](x).feats.astype(mx.float32))
    cases = []
    for k, m in models.items():
        y = np.array(m(x).feats.astype(mx.float32))
        nbytes = sum(v.nbytes for _, v in _flat(m.parameters()))
        cases.append(dict(
            bench="quantized", workload=wl, layer=f"MinkUNet {width}x forward", variant=k, dtype=dtype_name,
            n=len(coords), ms=times[k][0] * 1e3, cpu_ms=times[k][1] * 1e3,
            speedup=times["float"][0] / times[k][0], cpu_speedup=times["float"][1] / times[k][1],
            weight_bytes=nbytes, quantized_layers=getattr(m, "quantized_layers", (0, 0)),
            max_rel_error=float(np.abs(y - y_float).max() / np.abs(y_float).max()), threads=num_threads(),
        ))
    for k, m in models.items():
        cases[VARIANTS.index(k)]["weight_ratio"] = cases[0]["weight_bytes"] / cases[VARIANTS.index(k)]["weight_bytes"]
    return cases


def _flat(tree):
    from mlx.utils import tree_flatten

    return [(k, v) for k, v in tree_flatten(tree) if isinstance(v, mx.array)]


def format_case(c: dict) -> str:
    extra = ""
    if "quantized_layers" in c and c["variant"] != "float":
        extra = f"  {c['quantized_layers'][0]}/{c['quantized_layers'][1]} layers quantized"
    elif c.get("group_size"):
        extra = f"  group {c['group_size']}"
    return (f"{c['layer']:<24} {c['dtype']:<8} {c['variant']:<6} {c['ms']:>9.2f} {c['cpu_ms']:>9.2f} "
            f"{c['speedup']:>6.2f}x {c['cpu_speedup']:>6.2f}x {c['weight_bytes'] / 1024:>10.1f} "
            f"{c['weight_ratio']:>6.1f}x {c['max_rel_error']:>8.1e}  {c.get('route', 'network')}{extra}")


HEADER = (f"{'layer':<24} {'dtype':<8} {'weight':<6} {'wall ms':>9} {'CPU ms':>9} {'speed':>7} {'CPU':>7} "
          f"{'weight KiB':>10} {'smaller':>7} {'rel err':>8}  route")


def run_quantized(args) -> int:
    """``python -m mlx_lattice.bench --quantized``."""
    wls = (args.workloads or "lidar").split(",")
    dtypes = (args.dtypes or "float32").split(",")
    channels = [int(c) for c in args.channels.split(",")] if args.channels else list(CHANNELS[:2] if args.quick else CHANNELS)
    rounds = args.repeats or (3 if args.quick else 5)
    min_time_s = 0.0 if args.quick else 1.0
    print(f"mlx_lattice bench --quantized: {cpu_name()}, {os.cpu_count()} logical CPUs, {num_threads()} threads, "
          f"CPU path {_ext.cpu_isa()}, MLX {mx.__version__}")
    print("speed = float time / this time (above 1: faster than float); wall and process CPU time, best of "
          f"{rounds}+ calls taken in turns; weight KiB = codes + scales + biases (float: the weight); "
          "rel err = max |y - y_float| / max |y_float|")
    cases = []
    for wl in wls:
        coords, desc = workload(wl, args.quick)
        print(f"-- {wl}: {desc}: {len(coords):,} voxels")
        print(HEADER, flush=True)
        for dt in dtypes:
            for c in layer_cases(wl, coords, channels, dt, rounds, min_time_s):
                cases.append(c)
                print(format_case(c), flush=True)
            if not args.quick:
                for c in network_cases(wl, coords, args.width, dt, max(2, rounds - 2), min_time_s):
                    cases.append(c)
                    print(format_case(c), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cases, f, indent=1)
        print(f"wrote {len(cases)} cases to {args.json}")
    return 0
