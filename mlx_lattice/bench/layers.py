"""Single-layer benches on the CPU: each convolution pass of a layer
(forward, input gradient, weight gradient) and its map building, next to
the same run's NumPy sgemm, a gather -> NumPy matmul -> scatter baseline
and, where installed, spconv 2.x's CPU path; the network row of the same
table; grouped and depthwise layers; serialized-patch attention."""

from __future__ import annotations

import json

import numpy as np
import mlx.core as mx

from .. import _ext, num_threads, ops, routes
from ..nn.attention import patch_layout
from ..layout import mapped_weight
from ..relation import KernelGeometry
from ..serialization import serialization_order
from ..tensor import SparseTensor
from . import timing
from .timing import best_time, sgemm_gflops
from .training_step import TrainingStep, useful_flops
from .workloads import DTYPES, workload


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


def spconv_available() -> bool:
    try:  # optional dependencies, imported only to see that they are there
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
    import spconv.pytorch as spconv  # optional dependencies: imported where used
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
    # Each pass warmed up for timing.LAYER_WARMUP_S first: after the host-side work
    # between cases the pool's worker can take milliseconds to rejoin, and a
    # short kernel's first calls then run on one thread (wall time equal to
    # CPU time, about twice the steady time).
    times = {
        pname: best_time(fn, repeats, warmup_s=timing.LAYER_WARMUP_S, min_time_s=timing.LAYER_MIN_TIME_S)
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
        t = best_time(build, repeats, warmup_s=timing.LAYER_WARMUP_S)
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
    those of every convolution pass (``training_step.useful_flops``)."""
    step = TrainingStep(coords, width=width, dtype=DTYPES[dtype_name])
    flops = useful_flops(step)
    t = best_time(step, repeats, min_time_s=timing.NETWORK_MIN_TIME_S, max_calls=16)
    emit(dict(
        workload=wl, layer=f"MinkUNet {width}x", **{"pass": "train step"}, c_in=4, c_out=4,
        dtype=dtype_name, n=len(coords), edges=0, ms=t * 1e3, gflops=flops / t / 1e9,
        sgemm_fraction=flops / t / 1e9 / sgemm, useful_gflop=flops / 1e9, route="network",
    ))


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


def run_attention(args) -> int:
    """Serialized-patch attention on the CPU (the native patch kernel): PTv3's
    layout of the LiDAR sweep (z-order, patch 1024), 4 heads of C = 64.
    Useful FLOPs count only valid (query, key) pairs: 4 L^2 D per patch and
    head forward, 2.5 times that backward (recomputed scores, dV, dP, dK, dQ).
    The backward time is forward+backward minus forward."""
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
