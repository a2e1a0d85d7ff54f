"""The CUDA bench (``python -m mlx_lattice.bench --device gpu``): map
building on CUDA against the CPU builder, every route's passes against MLX's
dense matmul and a gather -> mx.matmul -> scatter reference, whole layers
and MinkUNet training steps, and spconv 2.x beside them where installed."""

from __future__ import annotations

import json
import time

import numpy as np
import mlx.core as mx

from .. import _ext, autodiff, diagnostics, ops, routes
from ..relation import KernelGeometry, Relation
from ..tensor import SparseTensor
from . import cuda_profile, spconv_side
from .cuda_profile import cuda_backend
from .profile import phases_json
from .timing import best_time
from .training_step import TrainingStep, eager_update_step
from .workloads import DTYPES, Layer, workload


def map_rows(wl, coords, repeats, spconv_maps=None) -> list[dict]:
    """Map building on the CPU builder and on CUDA (hash table + relation
    CSR + neighbour map; forward maps include the output support), same run;
    ``plans ms``: the same plus everything a training layer needs beyond
    (sorted plans of both directions, weight-gradient chunks); spconv: its
    ``get_indice_pairs_implicit_gemm`` (pairs and masks of both directions)."""
    cuda = cuda_backend()
    maps = cuda.maps

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
            # as a layer's coordinate manager builds them: a strided layer's
            # output set gets its own (trusted) table, and the relation onto
            # it is known to be onto the input's support
            t = maps.CudaTable(c)
            out = c if stride == 1 else maps.forward_support(t, geom)
            out_table = None if stride == 1 else maps.CudaTable(out, trusted=True)
            kind = "submanifold" if stride == 1 else "forward"
            native, plans, max_out, max_in = cuda.BACKEND.relation(t, out, geom, False, kind, out_table)
            view = cuda.view_of(Relation(native, KernelGeometry(*geom), "cuda", plans,
                                         max_neighbors=max_out, max_in_neighbors=max_in))
            back = autodiff.input_gradient_view(view)[0]
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


def _dgrad_weight(route, w, mirrored=False):
    """(weight, flip) an input gradient's product launches with (autodiff.conv's)."""
    wl, kw = autodiff.launch_operands(cuda_backend().BACKEND, route, w, (True, mirrored))
    return wl, kw.get("flip", (False, False))


def network_rows(wl, coords, repeats, dtype_name="float16", use_spconv=False) -> list[dict]:
    """A whole MinkUNet training step on CUDA (maps built inside: every call
    starts from a new coordinate manager), with the peak GPU memory of a step;
    with ``use_spconv`` the same network from spconv.pytorch modules beside it."""
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
        t_eager = best_time(eager_update_step(step), repeats)
        rows.append(dict(
            workload=wl, layer=f"MinkUNet {width}x", **{"pass": "train step"}, dtype=dtype_name,
            n=len(coords), edges=0, ms=t * 1e3, gflops=flops / t / 1e9, tflops=flops / t / 1e12,
            useful_gflop=flops / 1e9, peak_gib=peak / 2**30, route="network", sgemm_fraction=None,
            device=str(mx.default_device()), compiled_update=step.compiled, eager_adam_ms=t_eager * 1e3,
        ))
        sp = ""
        if use_spconv:
            r = spconv_side.network_step(coords, width, dtype_name, repeats)
            rows[-1].update(spconv_ms=r["step_s"] * 1e3, spconv_peak_gib=r["peak_bytes"] / 2**30,
                            speedup_vs_spconv=r["step_s"] / t, spconv_sync_ms=r["sync_step_s"] * 1e3,
                            spconv_loop_ms=r["loop_s"] * 1e3,
                            sync_speedup_vs_spconv=r["sync_step_s"] / t)
            sp = (f"; spconv {r['step_s']*1e3:.2f} ms ({r['step_s']/t:.2f}x), each step waited for "
                  f"{r['sync_step_s']*1e3:.2f} ms ({r['sync_step_s']/t:.2f}x), in a loop {r['loop_s']*1e3:.2f} ms, "
                  f"peak {r['peak_bytes']/2**30:.2f} GiB allocated")
        print(f"{wl:<7} {'MinkUNet ' + str(width) + 'x':<18} {'step':<8} {dtype_name:<9} {len(coords):>9,} "
              f"{'':>10} {t*1e3:>8.2f} {flops/t/1e12:>8.2f}  maps inside, peak {peak/2**30:.2f} GiB"
              f" (Adam as MLX ops: {t_eager*1e3:.2f} ms){sp}", flush=True)
    return rows


def run_gpu_profile(args) -> int:
    """The GPU step profile (mlx_lattice/bench/cuda_profile.py) of MinkUNet on
    the first workload, per width and dtype."""
    wl = (args.workloads or "lidar").split(",")[0]
    coords, desc = workload(wl, False)
    results = []
    for dt in (args.dtypes or "float16").split(","):
        for width in (0.5,):
            print(f"-- MinkUNet {width}x {dt} training step on {mx.default_device()}, {desc}: {len(coords):,} voxels",
                  flush=True)
            p = cuda_profile.profile(TrainingStep(coords, width=width, dtype=DTYPES[dt]), args.repeats or 5)
            print(cuda_profile.format_profile(p), flush=True)
            results.append(dict(workload=wl, width=width, dtype=dt, **{
                k: v for k, v in p.items() if k != "phases"}, phases=phases_json(p["phases"])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def run_gpu(args) -> int:
    """CUDA routes on the same workloads: useful TFLOP/s, the fraction of MLX's
    own dense matmul at a comparable size (M = edges, same channels and dtype)
    and the speed-up over gather -> mx.matmul -> scatter, all in one run."""
    cuda = cuda_backend()
    if not cuda.available():
        print("no CUDA device: python -m mlx_lattice.bench --device gpu needs MLX's CUDA backend")
        return 2
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
            back_view, mirrored = autodiff.input_gradient_view(view)
            plan, back, chunks = view.plan(), back_view.plan(), view.wgrad_chunks()
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
                mx.eval(x, w, ct)

                def pick(direction, vw, a, b):
                    ctx = routes.RouteContext(
                        op="bench", map_kind=vw.rel.kind, dtype=dt, backend="cuda", kernel_size=None,
                        k=rel.kernel_volume, c_in=a, c_out=b, n_in=n_in, n_out=vw.rows, edges=edges,
                        direction=direction, weight_layout="mapped",
                    )
                    return routes.select(ctx).route.name

                r_f = pick("forward", view, layer.c_in, layer.c_out)
                r_d = pick("dgrad", back_view, layer.c_out, layer.c_in)
                r_w = pick("wgrad", view, layer.c_in, layer.c_out)
                w_d, flip_d = _dgrad_weight(r_d, w, mirrored)
                fns = {
                    "forward": (r_f, lambda: cuda.find(r_f, "conv").run(x, w, view)),
                    # W read as autodiff reads it: transposed in place where the route can
                    "dgrad": (r_d, lambda: cuda.BACKEND.launch(
                        r_d, "conv", ct, w_d, back_view, flip=flip_d)),
                    "wgrad": (r_w, lambda: cuda.BACKEND.launch(r_w, "weight_grad", x, ct, view, rel.kernel_volume)),
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
            where = "CUDA" if cset.backend.name == "cuda" else "the CPU"
            print(f"   map building for {layer.name}: {t_map*1e3:.1f} ms (relation, swapped relation, "
                  f"sorted plans and wgrad chunks on {where}; first call, kernels compiled)", flush=True)
        cases += network_rows(wl, coords, max(2, repeats // 3), use_spconv=use_spconv)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cases, f, indent=1)
        print(f"wrote {len(cases)} cases to {args.json}")
    return 0
