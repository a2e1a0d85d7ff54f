"""Whole-network training step on the CPU: useful FLOPs and a per-stage profile.

``python -m mlx_lattice.bench.network [--workload lidar] [--width 0.5]`` times a
MinkUNet training step (maps built inside, forward, loss, backward, Adam
update) and replays each of its stages in isolation on the same arrays:
map building, tracing the backward graph, convolutions by pass (forward /
input gradient / weight gradient), normalisation, activations, residual
adds, concatenations, the cotangent sums of shared tensors, loss and
optimizer (``mlx_lattice.optimizers.Adam``, the fused update;
``--mlx-optimizer`` steps with ``mlx.optimizers.Adam``). Times are reported
next to the same run's NumPy sgemm.
``--compare`` also profiles the MLX-op normalisation path (no fused
norm + activation primitive) in the same run. ``--tuner`` times the step
with the static route order and with route-tuned choices side by side
(mlx_lattice.bench.tuner.compare_steps; docs/tuning.md).
:func:`network_layer_rows` (``python -m mlx_lattice.bench --network-layers``)
times every convolution product of the step by layer shape and pass.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager

import numpy as np
import mlx.core as mx
import mlx.optimizers

from .. import _ext, algebra, autodiff, backends, layout, num_threads, ops, scenes
from .. import optimizers as optim
from ..nn import normalization
from . import timing
from .timing import best_time, cpu_time, sgemm_gflops
from .training_step import TrainingStep, useful_flops
from .tuner import compare_steps, format_comparison
from .workloads import workload


@contextmanager
def _recording():
    """Record the convolution products (CPU and Metal routes, float
    weights), batch norms, concatenations and shared
    tensors (forks) of a forward pass, through the library's own records
    (``ops.record_products``, ``normalization.record_norms``,
    ``algebra.record_calls``); the lists fill when the block ends."""
    rec = {"conv": [], "norm": [], "cat": [], "fork": []}
    with ops.record_products() as products, normalization.record_norms() as norms, \
            algebra.record_calls() as calls:
        yield rec
    rec["conv"] += [(p.x, p.weight, p.native, p.view, p.route, backends.get(p.backend))
                    for p in products if backends.get(p.backend).differentiable_products and not p.quantized]
    rec["norm"] += [(n.norm, n.x, n.act, n.residual) for n in norms if isinstance(n.norm, normalization.BatchNorm)]
    rec["cat"] += [arrays for op, arrays in calls if op == "cat"]
    rec["fork"] += [arrays[0] for op, arrays in calls if op == "fork"]


def conv_flops(rec, input_feats) -> tuple[float, float, float]:
    """Useful FLOPs (forward, input gradient, weight gradient) of the recorded
    products: 2 * edges * C_in * C_out per pass, no input gradient for the
    network's input features."""
    f = d = w = 0.0
    for x, wt, native, _, _, _ in rec["conv"]:
        edges = native.edges if native is not None else x.shape[0]
        _, a, b = layout.kernel_dims(wt)  # either layout
        fl = 2.0 * edges * a * b
        f += fl
        w += fl
        if x is not input_feats:
            d += fl
    return f, d, w


def _vjp_time(fn, primals, argnums, repeats):
    """Seconds of fn's backward pass for the given primals (the forward
    products it needs included), with a fixed random cotangent."""
    out = fn(*primals)
    ct = mx.random.normal(out.shape).astype(out.dtype)
    mx.eval(ct)

    def run():
        def part(*sel):
            args = list(primals)
            for i, a in zip(argnums, sel):
                args[i] = a
            return fn(*args)

        _, grads = mx.vjp(part, [primals[i] for i in argnums], [ct])
        mx.eval(grads)

    return best_time(run, repeats)


def profile(step: TrainingStep, repeats: int = 3) -> dict:
    """Per-stage milliseconds of one training step (see the module doc)."""
    model = step.model
    stages = {}
    # The whole step as the bench's network row times it (one slow step from
    # the host's other work would otherwise land in "other").
    total = best_time(step, repeats, min_time_s=timing.NETWORK_MIN_TIME_S, max_calls=16)

    # Map building: the graph of a forward pass on a fresh manager, minus the
    # same graph on a manager that already holds every map.
    x0 = step.tensor()
    model(x0)
    t_fresh = best_time(lambda: model(step.tensor()), repeats)
    t_cached = best_time(lambda: model(x0), repeats)
    stages["maps (coordinate hashing, relations)"] = max(t_fresh - t_cached, 0.0)
    stages["graph building (Python)"] = t_cached
    # The backward graph: MLX tracing the VJPs, and the relations' kernel-
    # and input-major views built on first use (kernels idle meanwhile).
    t_traced = best_time(lambda: step.loss_grad(model, step.tensor()), repeats)
    stages["backward graph (tracing, relation views)"] = max(t_traced - t_fresh, 0.0)

    with _recording() as rec:
        y = model(step.tensor())
    mx.eval(y.feats, [r[:2] for r in rec["conv"]], [r[1] for r in rec["norm"]],
            [r[3] for r in rec["norm"] if r[3] is not None], rec["cat"])

    fwd = dgrad = wgrad = 0.0
    for x, w, native, view, route, backend in rec["conv"]:
        def conv(a, b, view=view, route=route, backend=backend):
            return autodiff.conv(backend, route, a, b, view)
        fwd += best_time(lambda: mx.eval(conv(x, w)), repeats)
        if x is not step.feats:
            dgrad += _vjp_time(conv, [x, w], [0], repeats)
        wgrad += _vjp_time(conv, [x, w], [1], repeats)
    stages["conv forward"] = fwd
    stages["conv input gradient"] = dgrad
    stages["conv weight gradient"] = wgrad

    # Norms replayed on fresh modules of the same kind (the model's running
    # statistics stay untouched), forward and forward + backward.
    fused = normalization.FUSED_ON_CPU
    keys = ("norm + act + add (fused) forward", "norm + act + add (fused) backward") if fused else (
        "norm forward", "norm backward")
    n_f = n_b = a_f = a_b = r_f = r_b = 0.0
    for mod, f, act, res in rec["norm"]:
        fresh = normalization.BatchNorm(f.shape[1], eps=mod.eps, momentum=mod.momentum)
        fresh.train(mod.training)
        w, b = mx.array(mod.weight), mx.array(mod.bias)

        def fn(a, w, b, r=None, fresh=fresh, act=act if fused else None):
            fresh.weight, fresh.bias = w, b
            return fresh(a, act=act, residual=r)

        primals = [f, w, b] + ([res] if fused and res is not None else [])
        t = best_time(lambda: mx.eval(fn(*primals)), repeats)
        n_f += t
        n_b += _vjp_time(fn, primals, list(range(len(primals))), repeats) - t
        if not fused:
            if act is not None:
                t = best_time(lambda: mx.eval(act(f)), repeats)
                a_f += t
                a_b += _vjp_time(lambda a, act=act: act(a), [f], [0], repeats) - t
            if res is not None:
                t = best_time(lambda: mx.eval(f + res), repeats)
                r_f += t
                r_b += _vjp_time(lambda a, b: a + b, [f, res], [0, 1], repeats) - t
    stages[keys[0]] = n_f
    stages[keys[1]] = max(n_b, 0.0)
    norm_bytes = _norm_bytes(rec["norm"]) if fused else None
    if not fused:
        stages["activation forward"] = a_f
        stages["activation backward"] = max(a_b, 0.0)
        stages["residual add forward"] = r_f
        stages["residual add backward"] = max(r_b, 0.0)

    c_f = c_b = 0.0
    for parts in rec["cat"]:
        fn = lambda *a: algebra._concat_columns(list(a))
        t = best_time(lambda: mx.eval(fn(*parts)), repeats)
        c_f += t
        c_b += _vjp_time(fn, parts, list(range(len(parts))), repeats) - t
    stages["concatenation forward"] = c_f
    stages["concatenation backward"] = max(c_b, 0.0)

    # Where a tensor feeds two layers its two cotangents are summed (by the
    # fork's backward pass on the CPU, else by MLX's Add): replayed on
    # random cotangents of each shared tensor's shape.
    t_sum = 0.0
    for f in rec["fork"]:
        a, b = (mx.random.normal(f.shape).astype(f.dtype) for _ in range(2))
        mx.eval(a, b)
        add = _ext.cotangent_sum if algebra._on_cpu(f) else mx.add
        t_sum += best_time(lambda: mx.eval(add(a, b)), repeats)
    stages["cotangent sums (shared tensors)"] = t_sum

    logits = y.feats
    stages["loss forward + backward"] = best_time(
        lambda: mx.eval(mx.grad(lambda a: mx.square(a.astype(mx.float32)).mean())(logits)), repeats)

    _, grads = step.loss_grad(model, step.tensor())
    mx.eval(grads)
    opt = step.optimizer_cls(learning_rate=1e-3)
    params = model.trainable_parameters()
    opt.init(params)

    def update():
        mx.eval(opt.apply_gradients(grads, params), opt.state)

    stages["optimizer (Adam)"] = best_time(update, repeats)
    staged = sum(stages.values())
    stages["other (scheduling, gathers, casts)"] = max(total - staged, 0.0)
    return {"total": total, "stages": stages, "flops": conv_flops(rec, step.feats),
            "norm_bytes": norm_bytes, "copy_gbs": copy_bandwidth() if fused else None}


def _norm_bytes(norms) -> tuple[float, float]:
    """Bytes the fused norms move per step (forward, backward), counting every
    array pass of the kernels (src/cpu/norm_act.cpp): forward, x twice (the
    statistics sweep, the normalising sweep), the residual, y; backward, x
    and ct twice and dx; with a residual, float32: x, y and ct, g (the
    residual's gradient) written, then g and x read and dx written; other
    dtypes read x, y and ct twice and write g and dx."""
    fwd = bwd = 0.0
    for _, f, _, res in norms:
        b = f.size * f.dtype.size
        fwd += b * (4 if res is not None else 3)
        bwd += b * (5 if res is None else 7 if f.dtype == mx.float32 else 8)
    return fwd, bwd


def copy_bandwidth(nbytes: int = 1 << 26) -> float:
    """GB/s of a NumPy copy (bytes read + written) of a 64 MB array."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    return 2 * nbytes / best_time(lambda: np.copyto(b, a), 5) / 1e9


def format_profile(prof: dict, sgemm: float, title: str) -> str:
    total = prof["total"]
    flops = sum(prof["flops"])
    lines = [
        f"{title}: {total * 1e3:.0f} ms per step, {flops / 1e9:.1f} useful GFLOP, "
        f"{flops / total / 1e9:.1f} GFLOP/s = {flops / total / 1e9 / sgemm:.0%} of sgemm ({sgemm:.0f} GFLOP/s)",
        "",
        "| stage | ms | share of step |",
        "|---|---:|---:|",
    ]
    for k, v in prof["stages"].items():
        lines.append(f"| {k} | {v * 1e3:.1f} | {v / total:.0%} |")
    if prof.get("norm_bytes"):
        (fb, bb), gbs = prof["norm_bytes"], prof["copy_gbs"]
        lines += ["", f"fused norms move {fb / 1e9:.2f} GB forward and {bb / 1e9:.2f} GB backward per "
                  f"step: {fb / gbs / 1e6:.0f} + {bb / gbs / 1e6:.0f} ms at the same run's NumPy copy "
                  f"bandwidth ({gbs:.1f} GB/s)"]
    return "\n".join(lines)


def network_layer_rows(coords, width: float = 0.5, repeats: int = 3):
    """Every convolution product of a MinkUNet training step on `coords`,
    grouped by layer shape: (sgemm GFLOP/s of CPU time, rows), each row with
    the shape, its count, useful FLOPs per call and per-call CPU seconds of
    forward, input gradient and weight gradient (none for the input layer)."""
    step = TrainingStep(coords, width=width)
    with _recording() as rec:
        y = step.model(step.tensor())
    mx.eval(y.feats, [r[:2] for r in rec["conv"]])
    rows = {}
    for x, w, native, view, route, backend in rec["conv"]:
        def conv(a, b, view=view, route=route, backend=backend):
            return autodiff.conv(backend, route, a, b, view)

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
        key = (*layout.kernel_dims(w), x.shape[0], y.shape[0], edges, route)
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mlx_lattice.bench.network", description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="lidar", help="lidar, mesh or random (as the bench)")
    p.add_argument("--width", type=float, default=0.5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compare", action="store_true", help="also profile the MLX-op norm path")
    p.add_argument("--mlx-optimizer", action="store_true",
                   help="step with mlx.optimizers.Adam instead of mlx_lattice.optimizers.Adam")
    p.add_argument("--tuner", action="store_true",
                   help="only time the step with the static route order and with tuned routes")
    p.add_argument("--tune-budget", type=float, default=120.0, help="with --tuner: seconds of measurement")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                   help="with --tuner: the step's feature dtype")
    args = p.parse_args(argv)
    coords, desc = workload(args.workload, quick=False)
    if args.tuner:
        res = compare_steps(coords, width=args.width, dtype=getattr(mx, args.dtype), repeats=args.repeats,
                            budget_s=args.tune_budget)
        where = mx.default_device()
        print(format_comparison(res, f"MinkUNet {args.width}x training step, {desc}: {len(coords):,} voxels, "
                                     f"{where}, {num_threads()} CPU threads, {args.dtype}"))
        return 0
    opt_cls = mlx.optimizers.Adam if args.mlx_optimizer else optim.Adam
    sgemm = sgemm_gflops()
    print(f"MinkUNet {args.width}x training step, {desc}: {len(coords):,} voxels "
          f"({scenes.neighbour_stats(coords):.2f} neighbours of 26), {num_threads()} threads, float32")
    print(f"CPU heap: {_ext.malloc_tuning()}")
    if args.compare:
        # Steps of the two paths interleaved (best of each), so that a load
        # change on a shared machine hits both alike.
        step = TrainingStep(coords, width=args.width, optimizer=opt_cls)
        best = {True: float("inf"), False: float("inf")}
        for _ in range(args.repeats + 1):
            for fused in (True, False):
                with normalization.fused_norms(fused):
                    t0 = time.perf_counter()
                    step()
                    best[fused] = min(best[fused], time.perf_counter() - t0)
        sgemm = max(sgemm, sgemm_gflops())
        flops = useful_flops(step)
        for fused in (True, False):
            name = "fused norm + activation" if fused else "MLX-op norms and activations"
            print(f"interleaved step, {name}: {best[fused] * 1e3:.0f} ms = "
                  f"{flops / best[fused] / 1e9 / sgemm:.0%} of sgemm ({sgemm:.0f} GFLOP/s)")
        print(f"speed-up of the step from the fused norms: {best[False] / best[True]:.2f}x\n", flush=True)
    modes = [True, False] if args.compare else [True]
    for fused in modes:
        with normalization.fused_norms(fused):
            step = TrainingStep(coords, width=args.width, optimizer=opt_cls)
            prof = profile(step, args.repeats)
        sgemm = max(sgemm, sgemm_gflops())
        title = "fused norm + activation" if fused else "MLX-op norms and activations"
        print(format_profile(prof, sgemm, title), "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
