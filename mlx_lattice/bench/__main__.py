"""Benchmarks: ``python -m mlx_lattice.bench [--quick] [--json out.json]``.

Workloads come from realistic geometry (a synthetic 64-beam LiDAR street
sweep, the voxelized surface of a closed mesh at 256^3, uniform random
voxels). Every figure is reported next to ratios measured in the same run:
the fraction of this machine's NumPy sgemm throughput, and the speed-up over
an explicit gather -> NumPy matmul -> scatter baseline on the same layer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import mlx.core as mx

from . import _ext, num_threads, ops, routes, scenes
from .ops import mapped_weight
from .relation import KernelGeometry
from .tensor import SparseTensor

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


LAYER_WARMUP_S = 0.2
# Layer passes are timed over at least this much time (best call of all):
# a few milliseconds' kernel then gets as wide a window as the sgemm
# reference's three 2048^3 products, and one slow call from the host
# machine's other work does not decide its row.
LAYER_MIN_TIME_S = 0.25
# The training step (~1 s on 2 cores) is timed over at least this much:
# about 8 steps rather than 2, so that one step slowed by the host's other
# work does not decide the network row.
NETWORK_MIN_TIME_S = 8.0


def best_time(
    fn, repeats: int, clock=time.perf_counter, warmup_s: float = 0.0, min_time_s: float = 0.0, max_calls: int = 500
) -> float:
    """Best of `repeats` calls of fn, in seconds of `clock`, after warming up:
    one call (allocations, lazily built views), then more until `warmup_s`
    seconds of wall time have passed. With `min_time_s`, calls go on past
    `repeats` until that much wall time has been timed (at most `max_calls`)."""
    end = time.perf_counter() + warmup_s
    fn()
    while time.perf_counter() < end:
        fn()
    best = float("inf")
    start = time.perf_counter()
    calls = 0
    while calls < repeats or (time.perf_counter() - start < min_time_s and calls < max_calls):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
        calls += 1
    return best


def sgemm_gflops(n=2048, repeats=3) -> float:
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    b = a.copy()
    return 2 * n**3 / best_time(lambda: a @ b, repeats) / 1e9


# ------------------------------------------------------------------ workloads
def workload(name: str, quick: bool):
    if name == "lidar":
        pts, _ = scenes.lidar_sweep(seed=0)
        return scenes.voxelize_points(pts, 0.05), "64-beam LiDAR street sweep, 5 cm voxels"
    if name == "mesh":
        v, f = scenes.procedural_closed_mesh()
        res = 128 if quick else 256
        return scenes.surface_voxels(v, f, resolution=res), f"closed-mesh surface at {res}^3"
    if name == "random":
        n = 50_000 if quick else 100_000
        return scenes.uniform_random(n, 96), f"{n} uniform random voxels in 96^3"
    raise ValueError(f"unknown workload {name!r}")


@dataclass
class Layer:
    name: str
    kind: str  # subm | down | up
    k: int
    c_in: int
    c_out: int


def layers(quick: bool):
    chans = (32, 64) if quick else (16, 32, 64, 128)
    out = [Layer(f"subm3 C{c}", "subm", 3, c, c) for c in chans]
    out.append(Layer("down k2s2 32->64", "down", 2, 32, 64))
    out.append(Layer("up k2s2 64->32", "up", 2, 64, 32))
    return out


# ------------------------------------------------------------------ baseline
def baseline_pass(pass_name, rel_np, x, w, ct):
    """Explicit per-offset gather -> NumPy matmul -> scatter (float32)."""
    out_idx, in_idx, k_idx = rel_np
    if pass_name == "forward":
        y = np.zeros((ct.shape[0], w.shape[2]), np.float32)
        for k in range(w.shape[0]):
            sel = k_idx == k
            y[out_idx[sel]] += x[in_idx[sel]] @ w[k]
        return y
    if pass_name == "dgrad":
        dx = np.zeros_like(x)
        for k in range(w.shape[0]):
            sel = k_idx == k
            dx[in_idx[sel]] += ct[out_idx[sel]] @ w[k].T
        return dx
    dw = np.zeros_like(w)
    for k in range(w.shape[0]):
        sel = k_idx == k
        dw[k] = x[in_idx[sel]].T @ ct[out_idx[sel]]
    return dw


# ------------------------------------------------------------------ spconv
def spconv_available() -> bool:
    try:
        import spconv.pytorch  # noqa: F401
        import torch  # noqa: F401
    except Exception:  # optional comparison: any import failure means absent
        return False
    return True


def spconv_compare(coords, layer, x_np, w5_np, ours_y, ours_coords, repeats):
    """Run spconv 2.x's CPU path on the same coordinates and weights.

    spconv's CPU kernels race with more than one torch thread, so it runs
    single-threaded. Returns (forward seconds with its map reused, map-building
    seconds, max abs difference to our output).
    """
    import spconv.pytorch as spconv
    import torch

    torch.set_num_threads(1)
    lo = coords[:, 1:].min(0) // 2 * 2  # even: strided grids keep their parity
    idx = coords.copy()
    idx[:, 1:] -= lo
    shape = (idx[:, 1:].max(0) + 4).tolist()
    batch = int(idx[:, 0].max()) + 1
    ks = layer.k
    if layer.kind == "subm":
        conv = spconv.SubMConv3d(layer.c_in, layer.c_out, ks, bias=False, indice_key="k")
    else:
        conv = spconv.SparseConv3d(layer.c_in, layer.c_out, ks, stride=2, bias=False, indice_key="k")
    with torch.no_grad():
        conv.weight.copy_(torch.from_numpy(w5_np))  # (C_out, Kx, Ky, Kz, C_in), as ours
    feats = torch.from_numpy(x_np)
    ind = torch.from_numpy(idx.astype(np.int32))

    def fresh():
        return spconv.SparseConvTensor(feats, ind, shape, batch)

    from spconv.core import ConvAlgo
    from spconv.pytorch import ops as spops

    subm = layer.kind == "subm"
    s = 1 if subm else 2
    pad = 1 if subm else 0
    # spconv's own map building (the index pairs its layers compute first)
    t_map = best_time(
        lambda: spops.get_indice_pairs(
            ind, batch, shape, ConvAlgo.Native, [ks] * 3, [s] * 3, [pad] * 3, [1] * 3, [0] * 3, subm, False
        ),
        max(1, repeats - 1),
    )
    with torch.no_grad():
        cached = fresh()
        conv(cached)  # builds the map into cached.indice_dict
        out = conv(cached)
        t_fwd = best_time(lambda: conv(cached), repeats)
    oc = out.indices.numpy().astype(np.int64)
    oc[:, 1:] += lo if layer.kind == "subm" else lo // 2
    ours = {tuple(c): i for i, c in enumerate(np.asarray(ours_coords).tolist())}
    rows = [ours.get(tuple(c)) for c in oc.tolist()]
    if any(r is None for r in rows) or len(rows) != len(ours):
        return t_fwd, t_map, float("inf")
    diff = float(np.abs(out.features.numpy() - ours_y[np.array(rows)]).max())
    return t_fwd, t_map, diff


# ------------------------------------------------------------------ cases
def rel_out_coords(m, cset, layer, geom):
    if layer.kind == "subm":
        return cset.coords
    return m.kernel_relation(cset, geom)[1].coords


def run_layer(wl, coords, layer, dtype_name, sgemm, repeats, baseline, emit, compare_spconv=False):
    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(1)
    base = SparseTensor(coords, np.zeros((len(coords), 1), np.float32))
    m = base.manager
    cset = base.coordinate_set
    ks = (layer.k,) * 3
    if layer.kind == "subm":
        geom = KernelGeometry(ks, (1, 1, 1), (1, 1, 1), (1, 1, 1))
        build = lambda: _ext.build_relation(cset.table, cset.coords, *geom.args(), False, "submanifold")
        rel = m.submanifold_kernel_relation(cset, geom)
        n_in = len(coords)
    elif layer.kind == "down":
        geom = KernelGeometry(ks, (2, 2, 2), (0, 0, 0), (1, 1, 1))

        def build():
            out = _ext.forward_support(cset.table, *geom.args())
            return _ext.build_relation(cset.table, out, *geom.args(), False, "forward")

        rel, _ = m.kernel_relation(cset, geom)
        n_in = len(coords)
    else:
        geom = KernelGeometry(ks, (2, 2, 2), (0, 0, 0), (1, 1, 1))
        _, coarse = m.kernel_relation(cset, geom)
        rel, _ = m.transposed_kernel_relation(coarse, geom)
        n_in = coarse.size
        build = None
    native = rel._native
    n_out, edges = rel.n_out, rel.edges
    ctx = routes.RouteContext(
        op="bench", map_kind=rel.kind, dtype=dtype_name, backend="cpu", kernel_size=ks,
        stride=geom.stride, padding=geom.padding, c_in=layer.c_in, c_out=layer.c_out,
        n_in=n_in, n_out=n_out, edges=edges,
    )
    route = routes.select(ctx).route.name
    x = mx.array(rng.standard_normal((n_in, layer.c_in)).astype(np.float32)).astype(dtype)
    w5 = mx.array(
        (rng.standard_normal((layer.c_out, *ks, layer.c_in)) / np.sqrt(layer.c_in * layer.k**3)).astype(np.float32)
    ).astype(dtype)
    # The parameter's own layout, read in place as in training (the CPU
    # kernels pack weight panels through the strides).
    w = mapped_weight(w5)
    wt = mx.swapaxes(w, 1, 2)
    ct = mx.array(rng.standard_normal((n_out, layer.c_out)).astype(np.float32)).astype(dtype)
    mx.eval(x, w, wt, ct)
    cpu = mx.default_stream(mx.cpu)
    passes = {
        "forward": lambda: mx.eval(_ext.gather_conv(x, w, native, _ext.View.output_major, route, cpu)),
        "dgrad": lambda: mx.eval(_ext.gather_conv(ct, wt, native, _ext.View.input_major, route, cpu)),
        "wgrad": lambda: mx.eval(_ext.weight_grad(x, ct, native, _ext.View.output_major, rel.kernel_volume, "cpu.wgrad_gemm", cpu)),
    }
    native.input_major(), native.kernel_major()  # views built once, as in training
    spconv_result = None
    if compare_spconv and dtype_name == "float32" and layer.kind in ("subm", "down"):
        y_ours = np.array(_ext.gather_conv(x, w, native, _ext.View.output_major, route, cpu))
        out_coords = np.array(rel_out_coords(m, cset, layer, geom))
        spconv_result = spconv_compare(
            np.asarray(coords), layer, np.array(x), np.array(w5), y_ours, out_coords, repeats
        )
    flops = 2.0 * edges * layer.c_in * layer.c_out
    rel_np = None
    if baseline:
        rel_np = (np.array(rel.out_idx), np.array(rel.in_idx), np.array(rel.k_idx))
        xn, wn, cn = (np.array(a.astype(mx.float32)) for a in (x, w, ct))
    # Our passes first, back to back; the NumPy baselines afterwards, so that
    # their large temporaries do not disturb the caches our timings see.
    # Each pass warmed up for LAYER_WARMUP_S first: after the host-side work
    # between cases the pool's worker can take milliseconds to rejoin, and a
    # short kernel's first calls then run on one thread (wall time equal to
    # CPU time, about twice the steady time).
    times = {
        pname: best_time(fn, repeats, warmup_s=LAYER_WARMUP_S, min_time_s=LAYER_MIN_TIME_S)
        for pname, fn in passes.items()
    }
    for pname, t in times.items():
        case = dict(
            workload=wl, layer=layer.name, **{"pass": pname}, c_in=layer.c_in, c_out=layer.c_out,
            dtype=dtype_name, n=n_out, edges=edges, ms=t * 1e3, gflops=flops / t / 1e9,
            sgemm_fraction=flops / t / 1e9 / sgemm,
            route={"forward": route, "dgrad": route, "wgrad": "cpu.wgrad_gemm"}[pname],
            threads=num_threads(), sgemm_gflops=sgemm,
        )
        if baseline:
            tb = best_time(lambda: baseline_pass(pname, rel_np, xn, wn, cn), max(1, repeats // 2))
            case["baseline_ms"] = tb * 1e3
            case["speedup_vs_baseline"] = tb / t
        if spconv_result is not None and pname == "forward":
            case["spconv_ms"] = spconv_result[0] * 1e3
            case["speedup_vs_spconv"] = spconv_result[0] / t
            case["spconv_max_abs_diff"] = spconv_result[2]
        emit(case)
    # Map building once per geometry (fp32 pass only): subm3 at C=64, strided.
    if build is not None and dtype_name == "float32" and (layer.kind == "down" or layer.c_in == 64):
        t = best_time(build, repeats, warmup_s=LAYER_WARMUP_S)
        queries = n_out * geom.volume  # one hash lookup per (output, offset)
        emit(dict(
            workload=wl, layer=f"map {rel.kind} {'x'.join(map(str, ks))}", **{"pass": "map"},
            c_in=layer.c_in, c_out=layer.c_out, dtype="int32", n=n_out, edges=edges, ms=t * 1e3,
            gflops=0.0, sgemm_fraction=0.0, route="cpu.hash_map", mqueries_per_s=queries / t / 1e6,
            **({"spconv_map_ms": spconv_result[1] * 1e3,
                "speedup_vs_spconv": spconv_result[1] / t}
               if spconv_result is not None else {}),
        ))


def run_unet(wl, coords, dtype_name, sgemm, repeats, emit, width=0.5):
    """A whole MinkUNet (TorchSparse layout) training step with maps built
    inside: forward, loss, backward and an Adam update. Its useful FLOPs are
    those of every convolution pass (``network_bench.useful_flops``)."""
    from .network_bench import TrainingStep, useful_flops

    step = TrainingStep(coords, width=width, dtype=DTYPES[dtype_name])
    flops = useful_flops(step)
    t = best_time(step, repeats, min_time_s=NETWORK_MIN_TIME_S, max_calls=16)
    emit(dict(
        workload=wl, layer=f"MinkUNet {width}x", **{"pass": "train step"}, c_in=4, c_out=4,
        dtype=dtype_name, n=len(coords), edges=0, ms=t * 1e3, gflops=flops / t / 1e9,
        sgemm_fraction=flops / t / 1e9 / sgemm, useful_gflop=flops / 1e9, route="network",
    ))


# ------------------------------------------------------------------ output
COLUMNS = [
    ("workload", "{:<7}"), ("layer", "{:<22}"), ("pass", "{:<16}"), ("dtype", "{:<8}"),
    ("n", "{:>8,}"), ("edges", "{:>9,}"), ("ms", "{:>8.2f}"), ("gflops", "{:>7.1f}"),
    ("sgemm_fraction", "{:>6.0%}"), ("speedup_vs_baseline", "{:>6.1f}x"),
    ("speedup_vs_spconv", "{:>7.1f}x"), ("route", " {}"),
]
HEADER = ["workload", "layer", "pass", "dtype", "n", "edges", "ms", "GFLOP/s", "sgemm", "vs base", "vs spconv", "route"]


def format_row(case) -> str:
    cells = []
    for (key, fmt), head in zip(COLUMNS, HEADER):
        v = case.get(key)
        if v is None or (key in ("gflops", "sgemm_fraction") and case["pass"] == "map"):
            extra = ""
            if key == "gflops" and "mqueries_per_s" in case:
                extra = f"{case['mqueries_per_s']:.0f}Mq/s"
            width = len(fmt.format(0)) if key != "route" else 0
            cells.append(extra.rjust(width))
        else:
            cells.append(fmt.format(v))
    return " ".join(cells)


# ------------------------------------------------------------------ GPU (CUDA)
def map_rows(wl, coords, repeats, spconv_maps=None) -> list[dict]:
    """Map building on the CPU builder and on CUDA (hash table + relation
    CSR + neighbour map; forward maps include the output support), same run;
    ``plans ms``: the same plus everything a training layer needs beyond
    (sorted plans of both directions, weight-gradient chunks); spconv: its
    ``get_indice_pairs_implicit_gemm`` (pairs and masks of both directions)."""
    from . import cuda
    from .cuda import maps
    from .relation import KernelGeometry, Relation

    c = mx.array(np.ascontiguousarray(coords, dtype=np.int32))
    mx.eval(c)
    rows = []
    for name, ks, stride, pad in (("subm k3", 3, 1, 1), ("down k2s2", 2, 2, 0), ("down k3s2", 3, 2, 1)):
        geom = ((ks,) * 3, (stride,) * 3, (pad,) * 3, (1, 1, 1))

        def cpu():
            t = _ext.CoordTable(c)
            out = c if stride == 1 else _ext.forward_support(t, *geom)
            kind = "submanifold" if stride == 1 else "forward"
            return _ext.build_relation(t, out, *geom, False, kind)

        def gpu():
            t = maps.CudaTable(c)
            out = c if stride == 1 else maps.forward_support(t, geom)
            kind = "submanifold" if stride == 1 else "forward"
            return maps.build_relation(t, out, geom, False, kind)

        def gpu_plans():
            t = maps.CudaTable(c)
            out = c if stride == 1 else maps.forward_support(t, geom)
            kind = "submanifold" if stride == 1 else "forward"
            native, max_out, max_in, sym = maps.build(t, out, geom, False, kind)
            view = cuda.view_of(Relation(native, KernelGeometry(*geom), gpu=True, symmetric=sym,
                                         max_neighbors=max_out, max_in_neighbors=max_in))
            back = view if view.symmetric else view.flipped()  # input gradients' view
            return vars(view.plan()), vars(back.plan()), view.wgrad_chunks()[:2]

        with mx.stream(mx.cpu):
            t_cpu = best_time(lambda: mx.eval(cpu().neighbor_map), max(2, repeats // 3))
        t_gpu = best_time(lambda: mx.eval(gpu().neighbor_map), repeats)
        t_plans = best_time(lambda: mx.eval(gpu_plans()), repeats)
        edges = gpu().edges
        t_sp = spconv_maps.get(name) if spconv_maps else None
        rows.append(dict(
            workload=wl, layer=f"map {name}", **{"pass": "map"}, n=len(coords), edges=edges,
            ms=t_gpu * 1e3, plans_ms=t_plans * 1e3, cpu_ms=t_cpu * 1e3, speedup_vs_cpu=t_cpu / t_gpu,
            route="cuda.hash_map", device=str(mx.default_device()),
            **({"spconv_ms": t_sp * 1e3, "speedup_vs_spconv": t_sp / t_plans} if t_sp else {}),
        ))
        sp = f", spconv {t_sp*1e3:.3f} ms: {t_sp/t_plans:.2f}x" if t_sp else ""
        print(f"{wl:<7} {'map ' + name:<18} {'map':<8} {'int32':<9} {len(coords):>9,} {edges:>10,} "
              f"{t_gpu*1e3:>8.3f} {'':>8} {'':>6} {t_cpu/t_gpu:>8.1f}x  cuda.hash_map (CPU builder {t_cpu*1e3:.1f} ms;"
              f" with plans {t_plans*1e3:.3f} ms{sp})", flush=True)
    return rows


def side_by_side_rows(wl, coords, dtype_name, repeats, chans) -> list[dict]:
    """Whole layers through the public ops (maps cached: forward, and forward
    + both gradients) against spconv's modules on the same coordinates and
    weights, same run."""
    from .cuda import spconv_side

    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(3)
    base = SparseTensor(coords, np.zeros((len(coords), 1), np.float32))
    lyrs = [Layer(f"subm3 C{c}", "subm", 3, c, c) for c in chans]
    lyrs += [Layer("down k2s2 32->64", "down", 2, 32, 64), Layer("up k2s2 64->32", "up", 2, 64, 32)]
    rows = []
    for layer in lyrs:
        ks = (layer.k,) * 3
        w5_np = (rng.standard_normal((layer.c_out, *ks, layer.c_in)) / np.sqrt(layer.c_in * layer.k**3)).astype(np.float32)
        if layer.kind == "subm":
            src, op = base, (lambda t, w: ops.subm_conv3d(t, w))
        elif layer.kind == "down":
            src, op = base, (lambda t, w: ops.conv3d(t, w, stride=2))
        else:
            w_down = mx.zeros((layer.c_in, *ks, layer.c_out), dtype)
            src = ops.conv3d(base.replace(mx.zeros((len(coords), layer.c_out), dtype)), w_down, stride=2)
            op = lambda t, w: ops.conv_transpose3d(t, w, stride=2)  # noqa: E731
        x_np = rng.standard_normal((len(src), layer.c_in)).astype(np.float32)
        x, w5 = mx.array(x_np).astype(dtype), mx.array(w5_np).astype(dtype)
        y = op(src.replace(x), w5)
        ct = mx.random.normal(y.feats.shape).astype(dtype)
        mx.eval(y.feats, ct)
        t_f = best_time(lambda: mx.eval(op(src.replace(x), w5).feats), repeats)
        t_fb = best_time(lambda: mx.eval(mx.vjp(lambda f, w: op(src.replace(f), w).feats, [x, w5], [ct])), repeats)
        sp = spconv_side.layer_times(np.asarray(coords), layer.kind, layer.k, layer.c_in, layer.c_out,
                                     w5_np, x_np, dtype_name, repeats)
        diff = None
        if layer.kind != "up":  # spconv orders the coarse rows otherwise: its up-layer inputs differ
            ours = np.array(y.feats.astype(mx.float32))
            oc = sp["out_indices"].astype(np.int64)
            oc[:, 1:] += sp["lo"] if layer.kind == "subm" else sp["lo"] // 2
            where = {tuple(r): i for i, r in enumerate(np.array(y.coords).tolist())}
            rows_ = [where.get(tuple(r)) for r in oc.tolist()]
            if None not in rows_ and len(rows_) == len(where):
                scale = max(float(np.abs(ours).max()), 1e-6)
                diff = float(np.abs(sp["out"] - ours[np.array(rows_)]).max()) / scale
            else:
                diff = float("inf")
        row = dict(
            workload=wl, layer=layer.name, **{"pass": "layer vs spconv"}, dtype=dtype_name, n=len(y),
            c_in=layer.c_in, c_out=layer.c_out, forward_ms=t_f * 1e3, fwd_bwd_ms=t_fb * 1e3,
            spconv_forward_ms=sp["forward_s"] * 1e3, spconv_fwd_bwd_ms=sp["fwd_bwd_s"] * 1e3,
            forward_vs_spconv=sp["forward_s"] / t_f,
            fwd_bwd_vs_spconv=sp["fwd_bwd_s"] / t_fb, max_rel_diff=diff, route="public op",
            device=str(mx.default_device()), sgemm_fraction=None,
        )
        rows.append(row)
        print(f"{wl:<7} {layer.name:<18} {dtype_name:<9} forward {t_f*1e3:7.3f} ms (spconv {sp['forward_s']*1e3:7.3f}:"
              f" {sp['forward_s']/t_f:5.2f}x)  fwd+bwd {t_fb*1e3:7.3f} ms (spconv {sp['fwd_bwd_s']*1e3:7.3f}:"
              f" {sp['fwd_bwd_s']/t_fb:5.2f}x)" + (f"  max rel diff {diff:.1e}" if diff is not None else ""),
              flush=True)
    return rows


def compiled_update_step(step):
    """The same training step with Adam's update compiled (``mx.compile``)
    into fused kernels, as MLX training loops write it."""
    state = [step.model.state, step.optimizer.state]
    update = mx.compile(lambda g: step.optimizer.update(step.model, g), inputs=state, outputs=state)

    def run():
        loss, grads = step.loss_grad(step.model, step.tensor())
        update(grads)
        mx.eval(loss, step.model.state, step.optimizer.state)
        return loss

    return run


def network_rows(wl, coords, repeats, dtype_name="float16", use_spconv=False) -> list[dict]:
    """A whole MinkUNet training step on CUDA (maps built inside: every call
    starts from a new coordinate manager), with the peak GPU memory of a step;
    with ``use_spconv`` the same network from spconv.pytorch modules beside it."""
    from . import diagnostics
    from .network_bench import TrainingStep

    rows = []
    for width in (0.5, 1.0):
        step = TrainingStep(coords, width=width, dtype=DTYPES[dtype_name])
        with diagnostics.record() as log:
            step()  # kernels compiled
        # FLOPs of every product the step ran: 2 * edges * C_in * C_out per
        # forward, input-gradient and weight-gradient pass.
        flops = sum(2.0 * r["edges"] * r["c_in"] * r["c_out"] for r in log)
        mx.reset_peak_memory()
        t = best_time(step, repeats)
        peak = mx.get_peak_memory()
        t_compiled = best_time(compiled_update_step(step), repeats)
        rows.append(dict(
            workload=wl, layer=f"MinkUNet {width}x", **{"pass": "train step"}, dtype=dtype_name,
            n=len(coords), edges=0, ms=t * 1e3, gflops=flops / t / 1e9, tflops=flops / t / 1e12,
            useful_gflop=flops / 1e9, peak_gib=peak / 2**30, route="network", sgemm_fraction=None,
            device=str(mx.default_device()), compiled_adam_ms=t_compiled * 1e3,
        ))
        sp = ""
        if use_spconv:
            from .cuda import spconv_side

            r = spconv_side.network_step(coords, width, dtype_name, repeats)
            rows[-1].update(spconv_ms=r["step_s"] * 1e3, spconv_peak_gib=r["peak_bytes"] / 2**30,
                            speedup_vs_spconv=r["step_s"] / t)
            sp = (f"; spconv {r['step_s']*1e3:.2f} ms ({r['step_s']/t:.2f}x), "
                  f"peak {r['peak_bytes']/2**30:.2f} GiB allocated")
        print(f"{wl:<7} {'MinkUNet ' + str(width) + 'x':<18} {'step':<8} {dtype_name:<9} {len(coords):>9,} "
              f"{'':>10} {t*1e3:>8.2f} {flops/t/1e12:>8.2f}  maps inside, peak {peak/2**30:.2f} GiB"
              f" (Adam compiled: {t_compiled*1e3:.2f} ms){sp}", flush=True)
    return rows


# One process's start: import, maps and the first two training steps of a
# MinkUNet 0.5x on the LiDAR sweep, each timed (run by run_startup).
_STARTUP = """
import json, sys, time
t0 = time.perf_counter()
import mlx.core as mx
import mlx_lattice
from mlx_lattice import bench
from mlx_lattice.network_bench import TrainingStep
mx.set_default_device(mx.gpu if sys.argv[1] == "gpu" else mx.cpu)
t_import = time.perf_counter() - t0
coords, _ = bench.workload("lidar", quick=False)
step = TrainingStep(coords, width=0.5, dtype=bench.DTYPES[sys.argv[2]])
times = []
for _ in range(2):
    t = time.perf_counter()
    step()
    mx.synchronize()
    times.append(time.perf_counter() - t)
print(json.dumps({"import_s": t_import, "first_step_s": times[0], "second_step_s": times[1],
                  "voxels": len(coords)}))
"""


def run_startup(args) -> int:
    """The first training step of a new process, twice per dtype: with empty
    kernel caches (ours, MLX_LATTICE_CUDA_CACHE, and MLX's, MLX_PTX_CACHE_DIR:
    a first run on the machine) and again with what the first process left
    there (every later process)."""
    import subprocess
    import tempfile

    device = args.device
    print(f"mlx_lattice bench --startup ({device}): a new process's import and first two MinkUNet 0.5x "
          "training steps on the LiDAR sweep; cold = empty kernel cache, warm = the next process", flush=True)
    rows = []
    for dt in (args.dtypes or "float32,float16").split(","):
        cache = tempfile.mkdtemp(prefix="mlx-kernel-cache-")
        for state in ("cold", "warm"):
            env = dict(os.environ, MLX_PTX_CACHE_DIR=os.path.join(cache, "mlx"),
                       MLX_LATTICE_CUDA_CACHE=os.path.join(cache, "mlx_lattice"))
            t = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", _STARTUP, device, dt], env=env,
                                 capture_output=True, text=True)
            wall = time.perf_counter() - t
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row.update(dtype=dt, cache=state, process_s=wall, device=device)
            rows.append(row)
            print(f"{dt:<9} {state:<5} import {row['import_s']:6.2f} s  first step {row['first_step_s']:7.2f} s  "
                  f"second step {row['second_step_s']:6.3f} s  whole process {wall:7.2f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def run_gpu_profile(args) -> int:
    """The GPU step profile (mlx_lattice/cuda/step_profile.py) of MinkUNet on
    the first workload, per width and dtype."""
    from .cuda import step_profile
    from .network_bench import TrainingStep

    wl = (args.workloads or "lidar").split(",")[0]
    coords, desc = workload(wl, False)
    results = []
    for dt in (args.dtypes or "float16").split(","):
        for width in (0.5,):
            print(f"-- MinkUNet {width}x {dt} training step on {mx.default_device()}, {desc}: {len(coords):,} voxels",
                  flush=True)
            p = step_profile.profile(TrainingStep(coords, width=width, dtype=DTYPES[dt]), args.repeats or 5)
            print(step_profile.format_profile(p), flush=True)
            results.append(dict(workload=wl, width=width, dtype=dt, **{
                k: v for k, v in p.items() if k != "phases"},
                phases={k: dict(host_s=v[0], eval_s=v[1], host_by_category_s=v[2], calls=v[3], syncs=v[4],
                                primitives=dict(v[5])) for k, v in p["phases"].items()}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def run_gpu(args) -> int:
    """CUDA routes on the same workloads: useful TFLOP/s, the fraction of MLX's
    own dense matmul at a comparable size (M = edges, same channels and dtype)
    and the speed-up over gather -> mx.matmul -> scatter, all in one run."""
    from . import cuda, routes

    if not cuda.available():
        print("no CUDA device: python -m mlx_lattice.bench --device gpu needs MLX's CUDA backend")
        return 2
    from .cuda import spconv_side

    wls = (args.workloads or "lidar,mesh").split(",")
    dtypes = (args.dtypes or "float16,bfloat16").split(",")
    repeats = args.repeats or 10
    chans = (64,) if args.quick else (32, 64, 128, 256, 512)
    if args.channels:
        chans = tuple(int(c) for c in args.channels.split(","))
    cases = []
    use_spconv = not args.no_spconv and spconv_side.available()
    if args.profile:
        return run_gpu_profile(args)
    print(f"mlx_lattice bench on {mx.default_device()}: CUDA routes, {repeats} repeats (best)"
          + ("; spconv side by side" if use_spconv else "; spconv not installed: no spconv columns"))
    hdr = f"{'workload':<7} {'layer':<18} {'pass':<8} {'dtype':<9} {'n':>9} {'edges':>10} {'ms':>8} {'TFLOP/s':>8} {'dense':>6} {'vs gather':>9}  route"
    print(hdr, flush=True)

    def timeit(fn):
        return best_time(lambda: mx.eval(fn()), repeats)

    for wl in wls:
        coords, desc = workload(wl, args.quick)
        print(f"-- {wl}: {desc}: {len(coords):,} voxels", flush=True)
        cases += map_rows(wl, coords, repeats, spconv_side.map_times(coords, repeats) if use_spconv else None)
        if use_spconv:
            cases += side_by_side_rows(wl, coords, dtypes[0], repeats, [c for c in chans if c <= 256])
        lyrs = [Layer(f"subm3 C{c}", "subm", 3, c, c) for c in chans]
        lyrs += [Layer("down k2s2 32->64", "down", 2, 32, 64), Layer("up k2s2 64->32", "up", 2, 64, 32)]
        for layer in lyrs:
            base = SparseTensor(coords, np.zeros((len(coords), 1), np.float32))
            m, cset = base.manager, base.coordinate_set
            ks = (layer.k,) * 3
            t0 = time.perf_counter()
            if layer.kind == "subm":
                geom = KernelGeometry(ks, (1, 1, 1), (1, 1, 1), (1, 1, 1))
                rel = m.submanifold_kernel_relation(cset, geom)
            elif layer.kind == "down":
                geom = KernelGeometry(ks, (2, 2, 2), (0, 0, 0), (1, 1, 1))
                rel, _ = m.kernel_relation(cset, geom)
            else:
                geom = KernelGeometry(ks, (2, 2, 2), (0, 0, 0), (1, 1, 1))
                _, coarse = m.kernel_relation(cset, geom)
                rel, _ = m.transposed_kernel_relation(coarse, geom)
            view = cuda.view_of(rel)
            plan, back, chunks = view.plan(), view.flipped().plan(), view.wgrad_chunks()
            mx.eval(vars(plan), vars(back), chunks[:2])
            t_map = time.perf_counter() - t0
            n_in, n_out, edges = rel.n_in, rel.n_out, rel.edges
            flops = 2.0 * edges * layer.c_in * layer.c_out
            for dt in dtypes:
                dtype = DTYPES[dt]
                rng = np.random.default_rng(0)
                x = mx.array(rng.standard_normal((n_in, layer.c_in)).astype(np.float32)).astype(dtype)
                w = mx.array((rng.standard_normal((rel.kernel_volume, layer.c_in, layer.c_out)) / 8).astype(np.float32)).astype(dtype)
                ct = mx.array(rng.standard_normal((n_out, layer.c_out)).astype(np.float32)).astype(dtype)
                wt = mx.contiguous(mx.swapaxes(w, 1, 2))
                mx.eval(x, w, ct, wt)

                def pick(direction, vw, a, b):
                    ctx = routes.RouteContext(
                        op="bench", map_kind=vw.rel.kind, dtype=dt, backend="cuda", kernel_size=None,
                        k=rel.kernel_volume, c_in=a, c_out=b, n_in=n_in, n_out=vw.rows, edges=edges,
                        direction=direction, weight_layout="mapped",
                    )
                    return routes.select(ctx).route.name

                r_f = pick("forward", view, layer.c_in, layer.c_out)
                r_d = pick("dgrad", view.flipped(), layer.c_out, layer.c_in)
                r_w = pick("wgrad", view, layer.c_in, layer.c_out)
                fns = {
                    "forward": (r_f, lambda: cuda.find(r_f, "conv").run(x, w, view)),
                    "dgrad": (r_d, lambda: cuda.find(r_d, "conv").run(ct, wt, view.flipped())),
                    "wgrad": (r_w, lambda: cuda.weight_grad(r_w, x, ct, view, rel.kernel_volume)),
                }
                # same-run references: dense matmul at M = edges, and gather -> matmul -> scatter
                a_d = mx.random.normal((edges, layer.c_in)).astype(dtype)
                b_d = mx.random.normal((layer.c_in, layer.c_out)).astype(dtype)
                mx.eval(a_d, b_d)
                dense = flops / timeit(lambda: a_d @ b_d)
                km = rel.kernel_major()
                koff = np.array(km.offsets)
                kin, kout = km.in_idx, km.out_idx

                def gather_matmul():
                    y = mx.zeros((n_out, layer.c_out), dtype=dtype)
                    for k in range(rel.kernel_volume):
                        a, b = int(koff[k]), int(koff[k + 1])
                        if a < b:
                            y = y.at[kout[a:b]].add(x[kin[a:b]] @ w[k])
                    return y

                t_base = timeit(gather_matmul)
                for pname, (route, fn) in fns.items():
                    t = timeit(fn)
                    case = dict(
                        workload=wl, layer=layer.name, **{"pass": pname}, c_in=layer.c_in, c_out=layer.c_out,
                        dtype=dt, n=n_out, edges=edges, ms=t * 1e3, gflops=flops / t / 1e9,
                        tflops=flops / t / 1e12, dense_fraction=flops / t / dense,
                        dense_tflops=dense / 1e12, route=route, map_ms=t_map * 1e3,
                        speedup_vs_gather_matmul=t_base / t if pname == "forward" else None,
                        sgemm_fraction=None, device=str(mx.default_device()),
                    )
                    cases.append(case)
                    vs = f"{case['speedup_vs_gather_matmul']:.1f}x" if pname == "forward" else ""
                    print(f"{wl:<7} {layer.name:<18} {pname:<8} {dt:<9} {n_out:>9,} {edges:>10,} {t*1e3:>8.3f} "
                          f"{flops/t/1e12:>8.1f} {flops/t/dense:>6.0%} {vs:>9}  {route}", flush=True)
            where = "CUDA" if cset.gpu_table is not None else "the CPU"
            print(f"   map building for {layer.name}: {t_map*1e3:.1f} ms (relation, swapped relation, "
                  f"sorted plans and wgrad chunks on {where}; first call, kernels compiled)", flush=True)
        cases += network_rows(wl, coords, max(2, repeats // 3), use_spconv=use_spconv)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cases, f, indent=1)
        print(f"wrote {len(cases)} cases to {args.json}")
    return 0


# ------------------------------------------------------------------ attention
def run_attention(args) -> int:
    """Serialized-patch attention on the CPU (the native patch kernel): PTv3's
    layout of the LiDAR sweep (z-order, patch 1024), 4 heads of C = 64.
    Useful FLOPs count only valid (query, key) pairs: 4 L^2 D per patch and
    head forward, 2.5 times that backward (recomputed scores, dV, dP, dK, dQ).
    The backward time is forward+backward minus forward."""
    from .nn.attention import patch_layout
    from .serialization import serialization_order

    channels, heads, patch = 64, 4, 1024
    d = channels // heads
    repeats = args.repeats or 3
    coords, desc = workload("lidar", False)
    order, _ = serialization_order(coords, "z")
    _, _, valid, p = patch_layout(order, coords[:, 0].astype(np.int64), patch)
    lengths = valid.reshape(-1, p).sum(1).astype(np.int32)
    flops = 4.0 * heads * d * float((lengths.astype(np.float64) ** 2).sum())
    sgemm = sgemm_gflops()
    print(f"mlx_lattice bench --attention: {num_threads()} threads, NumPy sgemm {sgemm:.1f} GFLOP/s (2048^3, same run)")
    print(f"-- {desc}: {len(coords):,} voxels, {len(lengths)} patches of {p}, {heads} heads x {d}")
    print(f"{'dtype':<9} {'pass':<9} {'ms':>9} {'GFLOP/s':>8} {'sgemm':>6}")
    cases = []
    lens = mx.array(lengths)
    for dt in (args.dtypes or "float32,float16").split(","):
        rng = np.random.default_rng(0)
        q, k, v, ct = (mx.array(rng.standard_normal((len(lengths), heads, p, d)).astype(np.float32)).astype(DTYPES[dt])
                       for _ in range(4))
        mx.eval(q, k, v, ct)
        fwd = lambda: mx.eval(_ext.patch_attention(q, k, v, lens, d ** -0.5))  # noqa: E731
        both = lambda: mx.eval(mx.vjp(  # noqa: E731
            lambda a, b, c: _ext.patch_attention(a, b, c, lens, d ** -0.5)[0], [q, k, v], [ct]))
        t_f = best_time(fwd, repeats)
        t_fb = best_time(both, repeats)
        sgemm = max(sgemm, sgemm_gflops())  # conservative: the best sgemm seen in this run
        for pname, t, fl in (("forward", t_f, flops), ("backward", t_fb - t_f, 2.5 * flops)):
            gf = fl / t / 1e9
            cases.append(dict(workload="lidar", layer=f"attention C{channels} H{heads} P{p}", **{"pass": pname},
                              dtype=dt, n=len(coords), ms=t * 1e3, gflops=gf, sgemm_fraction=gf / sgemm,
                              sgemm_gflops=sgemm, threads=num_threads()))
            print(f"{dt:<9} {pname:<9} {t * 1e3:>9.1f} {gf:>8.1f} {gf / sgemm:>6.0%}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cases, f, indent=1)
        print(f"wrote {len(cases)} cases to {args.json}")
    return 0


def run_grouped(coords, channels: int, groups: int, repeats: int) -> dict:
    """A 3x3x3 submanifold layer with `groups` channel groups: the grouped
    route (forward, and forward + both gradients) against, in the same run,
    gather -> per-group NumPy einsum -> scatter and the same layer as an
    ungrouped convolution with a block-diagonal weight (the gather-GEMM)."""
    rng = np.random.default_rng(0)
    x = SparseTensor(coords, mx.array(rng.standard_normal((len(coords), channels)).astype(np.float32)))
    ag = channels // groups
    w = mx.array(rng.standard_normal((channels, 3, 3, 3, ag)).astype(np.float32) * 0.1)
    full = np.zeros((channels, 3, 3, 3, channels), np.float32)
    wn = np.array(w)
    for j in range(groups):
        full[j * ag:(j + 1) * ag, ..., j * ag:(j + 1) * ag] = wn[j * ag:(j + 1) * ag]
    w_full = mx.array(full)
    layer = lambda f, w, g: ops.subm_conv3d(x.replace(f), w, groups=g).feats
    mx.eval(layer(x.feats, w, groups))
    rel = x.manager.submanifold_kernel_relation(x.coordinate_set, KernelGeometry((3,) * 3, (1,) * 3, (1,) * 3, (1,) * 3))
    edges = rel.edges
    train = mx.grad(lambda f, w: mx.square(layer(f, w, groups)).sum(), argnums=(0, 1))
    t_fwd = best_time(lambda: mx.eval(layer(x.feats, w, groups)), repeats)
    t_train = best_time(lambda: mx.eval(train(x.feats, w)), repeats)
    t_dense = best_time(lambda: mx.eval(layer(x.feats, w_full, 1)), repeats)
    xn = np.array(x.feats)
    km = rel.kernel_major()
    offs, gi, ri = np.array(km.offsets), np.array(km.in_idx), np.array(km.out_idx)
    wk = wn.reshape(groups, ag, 27, ag).transpose(2, 0, 3, 1)  # (K, G, Ag_in, Ag_out)

    def numpy_layer():
        y = np.zeros((len(coords), groups, ag), np.float32)
        for k in range(27):
            a, b = offs[k], offs[k + 1]
            if a == b:
                continue
            xg = xn[gi[a:b]].reshape(-1, groups, ag)
            np.add.at(y, ri[a:b], np.einsum("egi,gio->ego", xg, wk[k]))
        return y

    t_np = best_time(numpy_layer, repeats)
    flops = 2.0 * edges * ag * channels
    return {
        "case": f"subm 3^3 C={channels} groups={groups}", "voxels": len(coords), "edges": edges,
        "forward_ms": t_fwd * 1e3, "train_step_ms": t_train * 1e3, "gflops": flops / t_fwd / 1e9,
        "vs_numpy": t_np / t_fwd, "vs_block_diagonal": t_dense / t_fwd,
    }


def cpu_time(fn, repeats: int) -> float:
    """Best process CPU seconds of fn (all threads): on a machine shared with
    other jobs, far steadier than wall time, and comparable across calls."""
    return best_time(fn, repeats, clock=time.process_time)


def network_layer_rows(coords, width: float = 0.5, repeats: int = 3):
    """Every convolution product of a MinkUNet training step on `coords`,
    grouped by layer shape: (sgemm GFLOP/s of CPU time, rows), each row with
    the shape, its count, useful FLOPs per call and per-call CPU seconds of
    forward, input gradient and weight gradient (none for the input layer)."""
    from .network_bench import TrainingStep, _recording

    step = TrainingStep(coords, width=width)
    with _recording() as rec:
        y = step.model(step.tensor())
    mx.eval(y.feats, [r[:2] for r in rec["conv"]])
    rows = {}
    for x, w, native, view, route, stream in rec["conv"]:
        def conv(a, b, native=native, view=view, route=route, stream=stream):
            return _ext.gather_conv(a, b, native, view, route, stream)

        y = conv(x, w)
        ct = mx.random.normal(y.shape)
        mx.eval(y, ct)

        def grad(argnum, conv=conv, x=x, w=w, ct=ct):
            def part(p):
                return conv(p, w) if argnum == 0 else conv(x, p)
            mx.eval(mx.vjp(part, [(x, w)[argnum]], [ct])[1])

        times = [cpu_time(lambda: mx.eval(conv(x, w)), repeats),
                 cpu_time(lambda: grad(0), repeats) if x is not step.feats else None,
                 cpu_time(lambda: grad(1), repeats)]
        edges = native.edges if native is not None else x.shape[0]
        key = (w.shape[0], w.shape[1], w.shape[2], x.shape[0], y.shape[0], edges, route)
        row = rows.setdefault(key, {
            "K": key[0], "c_in": key[1], "c_out": key[2], "rows_in": key[3], "rows_out": key[4],
            "edges": edges, "route": route, "layers": 0, "flop": 2.0 * edges * key[1] * key[2],
            "seconds": [0.0, None, 0.0]})
        row["layers"] += 1
        for i, t in enumerate(times):
            if t is not None:
                row["seconds"][i] = (row["seconds"][i] or 0.0) + t
    out = list(rows.values())
    for row in out:
        row["seconds"] = [t / row["layers"] if t is not None else None for t in row["seconds"]]
    # The reference last: OpenBLAS's threads spin for a while after a
    # product, and their CPU time landed on the first layers timed after it
    # (the stem's 16 -> 16 forward read 5.8-7.4 ms against 3.0-3.5).
    a = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    sgemm = 2 * 2048**3 / cpu_time(lambda: a @ a, 5) / 1e9
    return sgemm, out


def run_network_layers(args) -> int:
    """Prints network_layer_rows as a table, largest share first."""
    wl = (args.workloads or "lidar").split(",")[0]
    coords, desc = workload(wl, quick=False)
    repeats = args.repeats or 3
    sgemm, rows = network_layer_rows(coords, args.width, repeats)
    print(f"MinkUNet {args.width}x training step, {desc}: {len(coords):,} voxels, {num_threads()} threads, "
          f"CPU path {_ext.cpu_isa()}, float32")
    print(f"CPU time (all threads) per call, best of {repeats}; NumPy sgemm {sgemm:.1f} GFLOP/s of CPU time "
          f"(2048^3, same run); % = useful GFLOP/s / sgemm")
    totals = [sum((r["seconds"][i] or 0.0) * r["layers"] for r in rows) for i in range(3)]
    print(f"all products: forward {totals[0] * 1e3:.0f} ms, input gradient {totals[1] * 1e3:.0f} ms, "
          f"weight gradient {totals[2] * 1e3:.0f} ms of CPU time")
    print("| K | C_in -> C_out | rows in -> out | edges per out row | route | layers | forward ms (% sgemm) "
          "| input grad ms | weight grad ms | share |")
    print("|---:|---|---|---:|---|---:|---|---|---|---:|")

    def total(r):
        return sum(t or 0.0 for t in r["seconds"]) * r["layers"]

    for r in sorted(rows, key=total, reverse=True):
        def cell(t, r=r):
            return f"{t * 1e3:.2f} ({r['flop'] / t / 1e9 / sgemm:.0%})" if t else "-"

        print(f"| {r['K']} | {r['c_in']} -> {r['c_out']} | {r['rows_in']:,} -> {r['rows_out']:,} "
              f"| {r['edges'] / r['rows_out']:.2f} | {r['route']} | {r['layers']} "
              f"| {' | '.join(cell(t) for t in r['seconds'])} | {total(r) / sum(totals):.1%} |")
    return 0


def format_header() -> str:
    cells = []
    for (key, fmt), head in zip(COLUMNS, HEADER):
        if key == "route":
            cells.append(" " + head)
        elif fmt.startswith("{:<"):
            cells.append(head.ljust(len(fmt.format(""))))
        else:
            cells.append(head.rjust(len(fmt.format(0))))
    return " ".join(cells)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mlx_lattice.bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a subset that runs in under a minute")
    p.add_argument("--json", help="write the cases as a JSON list to this path")
    p.add_argument("--workloads", default=None, help="comma list of lidar,mesh,random")
    p.add_argument("--dtypes", default=None, help="comma list (default float32,float16; quick: float32)")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--no-baseline", action="store_true", help="skip the NumPy gather-matmul baseline")
    p.add_argument("--no-spconv", action="store_true", help="skip spconv even when it is installed")
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="gpu: the CUDA routes")
    p.add_argument("--channels", default=None, help="with --device gpu: comma list of subm channel counts")
    p.add_argument("--profile", action="store_true",
                   help="with --device gpu: where a MinkUNet training step's time goes (mlx_lattice/cuda/step_profile.py)")
    p.add_argument("--grouped", action="store_true",
                   help="grouped and depthwise layers (cpu.grouped_gather) on the first workload")
    p.add_argument("--attention", action="store_true", help="only the CPU serialized-patch attention case")
    p.add_argument("--network-layers", action="store_true",
                   help="every convolution product of a MinkUNet training step by layer and pass (CPU time)")
    p.add_argument("--width", type=float, default=0.5, help="with --network-layers: the MinkUNet width")
    p.add_argument("--startup", action="store_true",
                   help="a new process's first training steps, with an empty and a warm kernel cache")
    args = p.parse_args(argv)
    if args.attention:
        return run_attention(args)
    if args.network_layers:
        return run_network_layers(args)
    if args.startup:
        return run_startup(args)
    if args.device == "gpu":
        return run_gpu(args)
    if args.grouped:
        coords, desc = workload((args.workloads or "lidar").split(",")[0], args.quick)
        print(f"mlx_lattice bench --grouped: {num_threads()} threads, {desc}, {len(coords):,} voxels")
        print("vs numpy = speed-up over gather -> per-group NumPy einsum -> scatter; vs block-diag = "
              "speed-up over the ungrouped gather-GEMM with a block-diagonal weight (same run)")
        cases = []
        for c, g in ((64, 64), (128, 128), (64, 8), (128, 4)):
            case = run_grouped(coords, c, g, args.repeats or (2 if args.quick else 3))
            cases.append(case)
            print(f"{case['case']:<28} fwd {case['forward_ms']:8.2f} ms  fwd+bwd {case['train_step_ms']:8.2f} ms  "
                  f"{case['gflops']:6.1f} GFLOP/s  vs numpy {case['vs_numpy']:6.1f}x  "
                  f"vs block-diag {case['vs_block_diagonal']:6.1f}x", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(cases, f, indent=1)
        return 0
    quick = args.quick
    wls = (args.workloads or ("lidar" if quick else "lidar,mesh,random")).split(",")
    dtypes = (args.dtypes or ("float32" if quick else "float32,float16")).split(",")
    repeats = args.repeats or (2 if quick else 3)
    sgemm = sgemm_gflops()
    print(f"mlx_lattice bench: {num_threads()} threads, CPU path {_ext.cpu_isa()}, NumPy sgemm {sgemm:.1f} GFLOP/s"
          " (2048^3, same run)")
    use_spconv = not args.no_spconv and spconv_available()
    print("ratios: sgemm = useful GFLOP/s / sgemm GFLOP/s; vs base = speed-up over gather->NumPy matmul->scatter")
    print("        vs spconv = speed-up over spconv 2.x CPU (1 torch thread; its CPU path races with more)"
          if use_spconv else "        spconv not installed: no spconv comparison (pip install torch==2.13.0 spconv==2.3.8)")
    print(format_header(), flush=True)
    cases = []
    peak = {"sgemm": sgemm}

    def emit(case):
        # Fractions use the best sgemm seen so far in this run (conservative
        # when the machine's throughput varies during the run).
        if case.get("gflops"):
            case["sgemm_gflops"] = peak["sgemm"]
            case["sgemm_fraction"] = case["gflops"] / peak["sgemm"]
        cases.append(case)
        print(format_row(case), flush=True)

    for wl in wls:
        coords, desc = workload(wl, quick)
        peak["sgemm"] = max(peak["sgemm"], sgemm_gflops())
        print(f"-- {wl}: {desc}: {len(coords):,} voxels, {scenes.neighbour_stats(coords):.2f} neighbours of 26"
              f" (sgemm so far {peak['sgemm']:.0f} GFLOP/s)", flush=True)
        for layer in layers(quick):
            for dt in dtypes:
                run_layer(wl, coords, layer, dt, sgemm, repeats,
                          baseline=not args.no_baseline and dt == "float32", emit=emit,
                          compare_spconv=use_spconv)
        if not quick or wl == wls[0]:
            run_unet(wl, coords, dtypes[0], sgemm, max(1, repeats - 1), emit)
    best = peak["sgemm"]
    for case in cases:
        if case.get("gflops"):
            case["sgemm_gflops"], case["sgemm_fraction"] = best, case["gflops"] / best
    print(f"best NumPy sgemm in this run: {best:.1f} GFLOP/s (JSON fractions use it)")
    for case in cases:
        if case["route"] == "network":
            print(f"network fraction ({case['workload']}, {case['layer']} training step, maps built inside): "
                  f"{case['sgemm_fraction']:.0%} of sgemm on {case['useful_gflop']:.1f} useful GFLOP")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cases, f, indent=1)
        print(f"wrote {len(cases)} cases to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
