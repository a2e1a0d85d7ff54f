"""Where a training step's time goes on CUDA: host time building the graph
(per layer kind, map building with its synchronisations included) against
the time evaluating it, with maps built inside and with maps cached, the
number of host synchronisations, the primitives in the step's graph, and the
isolated time of every convolution product the step runs.

``python -m mlx_lattice.bench --device gpu --profile`` prints it. Times are
wall-clock between ``mx.eval`` boundaries (MLX queues work lazily: graph
building on the host and the device's work overlap only inside an eval).
"""

from __future__ import annotations

import contextlib
import io
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
import mlx.core as mx

from .. import autodiff, diagnostics, ops
from ..nn import normalization
from ..relation import KernelGeometry, Relation
from ..tensor import SparseTensor
from .timing import best_time


def cuda_backend():
    """mlx_lattice's CUDA backend package, its map builders loaded as
    ``.maps``: the benches' one import of it, made on first use (a GPU
    backend that the CPU benches never load)."""
    from ..backends import cuda
    from ..backends.cuda import maps  # noqa: F401  (reached as cuda.maps)

    return cuda


@contextlib.contextmanager
def host_timers():
    """Accumulate host seconds and calls per category while a graph is built:
    convolution layers (map building inside them, from the ops' product
    records), normalisations with an activation or a residual (norm_act's
    calls, from the norm records), and every ``mx.eval`` (a host
    synchronisation). The totals fill when the block ends."""
    acc = defaultdict(float)
    calls = defaultdict(int)

    def add(label, seconds):
        acc[label] += seconds
        calls[label] += 1

    # mx.eval is MLX's (the library owns no hook for it): timed by wrapping
    # it for the block.
    orig_eval = mx.eval

    def timed_eval(*a, **k):
        t0 = time.perf_counter()
        try:
            return orig_eval(*a, **k)
        finally:
            add("mx.eval", time.perf_counter() - t0)

    with ops.record_products() as products, normalization.record_norms() as norms:
        mx.eval = timed_eval
        try:
            yield acc, calls
        finally:
            mx.eval = orig_eval
    for p in products:
        add(f"conv {p.kind} k{p.geometry.kernel_size[0]} s{p.geometry.stride[0]}", p.host_s)
    for n in norms:
        if n.act is not None or n.residual is not None:
            add("norm + act", n.host_s)


def graph_nodes(*arrays) -> Counter:
    """Primitives in the graph of these (unevaluated) arrays, by name."""
    buf = io.StringIO()
    mx.export_to_dot(buf, *arrays)
    return Counter(m.group(1) for m in re.finditer(r'label ="([^"]*)", shape=rectangle', buf.getvalue()))


def _conv_calls(step, tensor):
    """(route, x, mapped w, view, groups, variant) of every CUDA product of a
    forward pass."""
    with ops.record_products() as products:
        out = step.model(tensor)
    rec = [(p.route, p.x, p.weight, p.view, p.groups, p.variant) for p in products if p.backend == "cuda"]
    mx.eval(out.feats, [(r[1], r[2]) for r in rec])
    return rec


@dataclass(frozen=True)
class ProductTimes:
    """One convolution of the step, its three products each evaluated on its
    own: seconds and the route that ran each pass."""

    layer: str  # "submanifold k3 s1", ...
    c_in: int
    c_out: int
    rows: int
    edges: int  # rows for a pointwise product
    forward_s: float
    dgrad_s: float
    wgrad_s: float
    routes: tuple  # (forward, dgrad, wgrad)

    def passes(self):
        """(pass, seconds, route) of each product."""
        return zip(("forward", "dgrad", "wgrad"), (self.forward_s, self.dgrad_s, self.wgrad_s), self.routes)


def _ran(fn, direction: str) -> str:
    """The route of the last `direction` product `fn` runs (from the route log)."""
    with diagnostics.record() as log:
        mx.eval(fn())
    ran = [r["route"] for r in log if r.get("direction") == direction]
    return ran[-1] if ran else "?"


def conv_device_times(step, tensor, repeats) -> list[ProductTimes]:
    """Every convolution of the step's forward pass with the isolated
    seconds of its forward product, input gradient and weight gradient,
    each evaluated on its own, and the routes that ran them."""
    cuda = cuda_backend()
    out = []
    for route, x, w, view, groups, variant in _conv_calls(step, tensor):
        f = lambda a, b, route=route, view=view, groups=groups, variant=variant: autodiff.conv(  # noqa: E731
            cuda.BACKEND, route, a, b, view, groups, variant)
        y = f(x, w)
        ct = mx.random.normal(y.shape).astype(y.dtype)
        mx.eval(y, ct)
        dgrad = lambda: mx.vjp(lambda a: f(a, w), [x], [ct])[1]  # noqa: E731
        wgrad = lambda: mx.vjp(lambda b: f(x, b), [w], [ct])[1]  # noqa: E731
        rel = None if view is None else view.rel
        kind = "pointwise" if rel is None else f"{rel.kind} k{rel.geometry.kernel_size[0]} s{rel.geometry.stride[0]}"
        out.append(ProductTimes(
            layer=kind, c_in=x.shape[1], c_out=y.shape[1], rows=y.shape[0],
            edges=x.shape[0] if rel is None else rel.edges,
            forward_s=best_time(lambda: mx.eval(f(x, w)), repeats),
            dgrad_s=best_time(lambda: mx.eval(dgrad()), repeats),
            wgrad_s=best_time(lambda: mx.eval(wgrad()), repeats),
            routes=(route, _ran(dgrad, "dgrad"), _ran(wgrad, "wgrad")),
        ))
    return out


def format_products(products: list[ProductTimes], top: int = 5) -> list[str]:
    """The products' totals by pass and the `top` slowest products."""
    tot = [sum(t for p in products for name, t, _ in p.passes() if name == want)
           for want in ("forward", "dgrad", "wgrad")]
    lines = [f"isolated products of the step ({len(products)} convolutions): forward {tot[0]*1e3:.1f} ms, "
             f"input gradients {tot[1]*1e3:.1f} ms, weight gradients {tot[2]*1e3:.1f} ms; the slowest:"]
    each = sorted(((t, name, r, p) for p in products for name, t, r in p.passes()), key=lambda e: -e[0])
    for t, name, r, p in each[:top]:
        unit = "rows " if p.layer == "pointwise" else "edges"
        lines.append(f"   {name:<8} {r:<22} {p.layer:<22} {p.c_in:>5} -> {p.c_out:<5} {p.edges:>10,} {unit} "
                     f"{t*1e3:8.3f} ms")
    return lines


def map_stages(coords, repeats: int) -> dict:
    """Seconds of each stage of building a layer's maps on CUDA, each stage
    evaluated on its own: the table (with and without reading its error
    flags), the output support, the relation (its one synchronisation
    included), the sorted plans of both directions and the weight-gradient
    chunks; and the round trip of one host synchronisation."""
    cuda = cuda_backend()
    maps = cuda.maps
    c = mx.array(np.ascontiguousarray(coords, dtype=np.int32))
    mx.eval(c)
    out = {}
    one = mx.array([1], mx.int32)
    mx.eval(one)
    out["host synchronisation round trip"] = best_time(lambda: np.array(one + 1), repeats)
    out["table (error flags read)"] = best_time(lambda: maps.CudaTable(c), repeats)
    out["table (trusted)"] = best_time(lambda: mx.eval(maps.CudaTable(c, trusted=True).keys), repeats)
    table = maps.CudaTable(c)
    for name, geom in (("subm k3", ((3,) * 3, (1,) * 3, (1,) * 3, (1,) * 3)),
                       ("down k2s2", ((2,) * 3, (2,) * 3, (0,) * 3, (1,) * 3))):
        if geom[1] == (1, 1, 1):
            dst = c
        else:
            for dedup in ("hash", "sort"):
                out[f"{name}: output support ({dedup})"] = best_time(
                    lambda: mx.eval(maps.forward_support(table, geom, dedup=dedup)), repeats)
            dst = maps.forward_support(table, geom)
            mx.eval(dst)
        kind = "submanifold" if dst is c else "forward"

        def build():
            native, plans, a, b, sym = cuda.BACKEND.relation(table, dst, geom, False, kind)
            mx.eval(native.in_idx, native.k_idx, native.neighbor_map)
            return Relation(native, KernelGeometry(*geom), "cuda", plans, max_neighbors=a, max_in_neighbors=b,
                            symmetric=sym)

        out[f"{name}: relation"] = best_time(build, repeats)

        def stage(fn):
            def run():
                view = cuda.view_of(build())
                mx.eval(view.rel.neighbor_map)
                t0 = time.perf_counter()
                mx.eval(fn(view))
                return time.perf_counter() - t0
            run()
            return min(run() for _ in range(repeats))

        out[f"{name}: sorted plan"] = stage(lambda v: vars(v.plan()))
        out[f"{name}: swapped relation + its sorted plan"] = stage(lambda v: vars(v.flipped().plan()))
        out[f"{name}: weight-gradient chunks"] = stage(lambda v: v.wgrad_chunks()[:2])
    return out


def _arrays(obj, seen: set, out: list):
    """Every mx.array reachable from ``obj`` through tuples, lists, dicts and
    dataclass fields, each once."""
    if isinstance(obj, mx.array):
        if id(obj) not in seen:
            seen.add(id(obj))
            out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            _arrays(o, seen, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _arrays(o, seen, out)
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            _arrays(getattr(obj, name), seen, out)


def map_arrays(manager) -> list:
    """The arrays a coordinate manager keeps for its maps: each GPU
    coordinate table, each relation's CSR arrays, the neighbour map a GPU
    builder made, and every derived array built so far (plans, views, the
    swapped relations' own), each once. Nothing is built by asking."""
    seen, out, done = set(), [], set()

    def views(v):
        if v is None or id(v) in done:
            return
        done.add(id(v))
        _arrays(v._cache, seen, out)
        _arrays((v.native.out_offsets, v.native.in_idx, v.native.k_idx), seen, out)
        views(getattr(v, "_swapped", None))

    for cset in {id(c): c for c in manager._sets.values()}.values():
        table = cset.native_table
        _arrays([getattr(table, name, None) for name in ("keys", "vals")], seen, out)  # GPU tables
    for rel, _ in manager._relations.values():
        if rel is None:
            continue
        _arrays((rel._native.out_offsets, rel._native.in_idx, rel._native.k_idx), seen, out)
        if rel.backend != "cpu":  # set by the GPU builders (the CPU's is made on demand)
            _arrays(rel._native.neighbor_map, seen, out)
        views(rel._views)
    return out


def memory(step) -> dict:
    """Bytes of one training step (maps built inside): what stays allocated
    between steps (parameters, optimizer state, MLX's own), the arrays the
    sample's maps keep (``map_arrays``), and the peaks of the forward pass
    alone, of forward and backward, and of the whole step with its update,
    each measured from the same start."""
    from .training_step import loss_fn

    step()
    mx.synchronize()
    mx.clear_cache()
    held = mx.get_active_memory()
    x = step.tensor()
    mx.reset_peak_memory()
    loss = loss_fn(step.model, x)  # builds every map of the sample (their synchronisations)
    kept = map_arrays(x.manager)
    mx.eval(kept)
    maps_peak = mx.get_peak_memory()
    mx.reset_peak_memory()
    mx.eval(loss)
    forward_peak = mx.get_peak_memory()
    del loss
    mx.reset_peak_memory()
    loss, grads = step.loss_grad(step.model, x)
    mx.eval(loss, grads)
    backward_peak = mx.get_peak_memory()
    del loss, grads
    mx.reset_peak_memory()
    step()
    return {
        "held_bytes": held, "map_bytes": sum(a.nbytes for a in kept), "map_arrays": len(kept),
        "maps_peak_bytes": maps_peak, "forward_peak_bytes": forward_peak,
        "forward_backward_peak_bytes": backward_peak, "step_peak_bytes": mx.get_peak_memory(),
    }


def format_memory(m: dict) -> str:
    mib = lambda b: f"{b / 2**20:,.0f} MiB"  # noqa: E731
    return (f"memory: {mib(m['held_bytes'])} held between steps; the sample's maps keep "
            f"{mib(m['map_bytes'])} in {m['map_arrays']} arrays; peaks: building the maps "
            f"{mib(m['maps_peak_bytes'])}, forward {mib(m['forward_peak_bytes'])}, forward + backward "
            f"{mib(m['forward_backward_peak_bytes'])}, the whole step {mib(m['step_peak_bytes'])}")


def profile(step, repeats: int = 5) -> dict:
    """Profile of a TrainingStep (mlx_lattice/bench/training_step.py) on CUDA."""
    maps = cuda_backend().maps
    step()  # kernels compiled, optimizer state made
    # First, while no other sample's maps are alive (the tensors below keep theirs).
    mem = memory(step)
    cached_x = step.tensor()
    step.loss_grad(step.model, cached_x)  # every map of cached_x built

    def phases(tensor_fn):
        """(host s, eval s, host seconds by category, calls, syncs in maps, nodes).
        The host and evaluation seconds come from a build as a step makes it;
        the categories from a second build under the per-layer timers, whose
        own records (every product's and norm's arguments kept) cost about
        as much host time again as the build itself."""
        reads = Counter(maps.READS)
        t0 = time.perf_counter()
        x = tensor_fn()
        loss, grads = step.loss_grad(step.model, x)
        step.update(grads)
        t1 = time.perf_counter()
        syncs = dict(maps.READS - reads)
        nodes = graph_nodes(loss, step.model.parameters(), step.optimizer.state)
        t2 = time.perf_counter()
        mx.eval(loss, step.model.state, step.optimizer.state)
        t3 = time.perf_counter()
        with host_timers() as (acc, calls):
            x = tensor_fn()
            loss, grads = step.loss_grad(step.model, x)
            step.update(grads)
        mx.eval(loss, step.model.state, step.optimizer.state)
        return t1 - t0, t3 - t2, dict(acc), dict(calls), syncs, nodes

    out = {}
    for name, fn in (("maps built", step.tensor), ("maps cached", lambda: cached_x)):
        best = None
        for _ in range(repeats):
            r = phases(fn)
            if best is None or r[0] + r[1] < best[0] + best[1]:
                best = r
        out[name] = best
    step_built = best_time(step, repeats)

    def cached_step():
        loss, grads = step.loss_grad(step.model, cached_x)
        step.update(grads)
        mx.eval(loss, step.model.state, step.optimizer.state)

    step_cached = best_time(cached_step, repeats)

    # The same graph on every 16th row: as many primitives, a sixteenth of
    # the GPU's work. Its evaluation time is about what dispatching the
    # step's primitives costs whatever the rows; the rest of the full
    # step's evaluation is the GPU working.
    small = SparseTensor(step.coords[::16], step.feats[::16])
    step.loss_grad(step.model, small)  # its maps

    def small_eval():
        loss, grads = step.loss_grad(step.model, small)
        step.update(grads)
        t0 = time.perf_counter()
        mx.eval(loss, step.model.state, step.optimizer.state)
        return time.perf_counter() - t0

    small_eval()
    eval_floor = min(small_eval() for _ in range(repeats))
    products = conv_device_times(step, cached_x, repeats)
    # Adam alone on fixed gradients, as MLX ops and compiled into fused kernels.
    _, grads = step.loss_grad(step.model, cached_x)
    mx.eval(grads)
    t_adam = best_time(lambda: (step.optimizer.update(step.model, grads),
                            mx.eval(step.model.state, step.optimizer.state)), repeats)
    state = [step.model.state, step.optimizer.state]
    update = mx.compile(lambda g: step.optimizer.update(step.model, g), inputs=state, outputs=state)
    t_adam_compiled = best_time(lambda: (update(grads), mx.eval(state)), repeats)
    # What one small primitive costs: a chain of 1000 dependent adds.
    z = mx.zeros((1024,), mx.float32)
    mx.eval(z)

    def chain():
        a = z
        for _ in range(1000):
            a = a + 1.0
        mx.eval(a)

    t_chain = best_time(chain, repeats)
    return {
        "step_built_s": step_built, "step_cached_s": step_cached, "eval_floor_s": eval_floor,
        "phases": out, "products": products, "adam_s": t_adam,
        "adam_compiled_s": t_adam_compiled, "primitive_s": t_chain / 1000,
        "map_stages_s": map_stages(step.coords, repeats), "memory": mem,
    }


def format_profile(p: dict) -> str:
    lines = [
        f"step with maps built: {p['step_built_s']*1e3:.1f} ms; with maps cached: {p['step_cached_s']*1e3:.1f} ms",
        *format_products(p["products"]),
        f"Adam alone {p['adam_s']*1e3:.1f} ms (compiled: {p['adam_compiled_s']*1e3:.1f} ms)",
        f"one small primitive (a chain of 1000 adds): {p['primitive_s']*1e6:.1f} us",
        f"evaluation of the step (maps cached) on every 16th row: {p['eval_floor_s']*1e3:.1f} ms "
        "(about what dispatching the step's primitives costs, whatever the rows)",
    ]
    lines.append(format_memory(p["memory"]))
    lines.append("map stages (each evaluated on its own):")
    for name, t in p["map_stages_s"].items():
        lines.append(f"   {name:<44} {t*1e3:8.3f} ms")
    for name, (host, ev, acc, calls, syncs, nodes) in p["phases"].items():
        top = ", ".join(f"{k} {v}" for k, v in nodes.most_common(8))
        lines.append(f"-- {name}: host graph building {host*1e3:.1f} ms, eval {ev*1e3:.1f} ms, "
                     f"map synchronisations {sum(syncs.values())} {syncs}")
        lines.append(f"   {sum(nodes.values())} primitives in the step's graph ({top}, ...)")
        if acc:
            lines.append("   host by category (a second build, under per-layer timers that add their own cost):")
        for label in sorted(acc, key=lambda k: -acc[k]):
            lines.append(f"   {label:<24} {calls[label]:>4} calls {acc[label]*1e3:>8.2f} ms host")
    return "\n".join(lines)
