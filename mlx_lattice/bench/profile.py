"""Where a training step's time goes, on any backend: host time building the
graph (per layer kind, map building with its synchronisations included)
against the time evaluating it, with maps built inside and with maps
cached, the primitives in the step's graph by kind, what one small
primitive costs, Adam alone, and the step's memory.

``python -m mlx_lattice.bench --profile`` prints it for the default device
(``--device gpu``: CUDA, whose extras are in ``cuda_profile``). Times are
wall-clock between ``mx.eval`` boundaries (MLX queues work lazily: graph
building on the host and the device's work overlap only inside an eval).
"""

from __future__ import annotations

import contextlib
import io
import json
import platform
import re
import time
from collections import Counter, defaultdict

import mlx.core as mx

from .. import backends, ops
from ..nn import normalization
from .timing import best_time


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
        if rel._native.has_neighbor_map:  # the GPU builders make it; the CPU's on demand
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


def phases(step, cached_x, repeats: int, reads: Counter | None = None) -> dict:
    """{"maps built": phase, "maps cached": phase}, each the best of
    ``repeats`` builds by host + evaluation seconds, a phase being (host s,
    eval s, host seconds by category, calls, map synchronisations by what
    they read, primitives by kind). The host and evaluation seconds come
    from a build as a step makes it; the categories from a second build
    under the per-layer timers, whose own records (every product's and
    norm's arguments kept) cost about as much host time again as the build
    itself. ``reads``: the backend's counter of map reads (None: none)."""

    def one(tensor_fn):
        before = Counter(reads or {})
        t0 = time.perf_counter()
        x = tensor_fn()
        loss, grads = step.loss_grad(step.model, x)
        step.update(grads)
        t1 = time.perf_counter()
        syncs = dict(Counter(reads or {}) - before)
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
            r = one(fn)
            if best is None or r[0] + r[1] < best[0] + best[1]:
                best = r
        out[name] = best
    return out


def primitive_s(repeats: int) -> float:
    """Seconds of one small primitive: a chain of 1000 dependent adds."""
    z = mx.zeros((1024,), mx.float32)
    mx.eval(z)

    def chain():
        a = z
        for _ in range(1000):
            a = a + 1.0
        mx.eval(a)

    return best_time(chain, repeats) / 1000


def adam_s(step, x, repeats: int) -> tuple[float, float]:
    """Seconds of the optimizer's update alone on fixed gradients: as the
    step runs it, and under ``mx.compile``."""
    _, grads = step.loss_grad(step.model, x)
    mx.eval(grads)
    eager = best_time(lambda: (step.optimizer.update(step.model, grads),
                               mx.eval(step.model.state, step.optimizer.state)), repeats)
    state = [step.model.state, step.optimizer.state]
    update = mx.compile(lambda g: step.optimizer.update(step.model, g), inputs=state, outputs=state)
    compiled = best_time(lambda: (update(grads), mx.eval(state)), repeats)
    return eager, compiled


def profile(step, repeats: int = 5, reads: Counter | None = None) -> dict:
    """Profile of a TrainingStep (mlx_lattice/bench/training_step.py) on the
    current backend: the whole step with maps built and cached, the phases
    (``phases``), Adam alone, one small primitive's cost and the memory.
    ``reads``: the backend's counter of map reads, where it has one."""
    step()  # kernels compiled, optimizer state made
    # First, while no other sample's maps are alive (the tensors below keep theirs).
    mem = memory(step)
    cached_x = step.tensor()
    # every map of cached_x built; evaluated with the model's state, so that
    # no later graph holds this pass through the running statistics
    mx.eval(step.loss_grad(step.model, cached_x), step.model.state)
    out = phases(step, cached_x, repeats, reads)
    step_built = best_time(step, repeats)

    def cached_step():
        loss, grads = step.loss_grad(step.model, cached_x)
        step.update(grads)
        mx.eval(loss, step.model.state, step.optimizer.state)

    step_cached = best_time(cached_step, repeats)
    t_adam, t_adam_compiled = adam_s(step, cached_x, repeats)
    return {
        "backend": backends.current().name, "step_built_s": step_built, "step_cached_s": step_cached,
        "phases": out, "adam_s": t_adam, "adam_compiled_s": t_adam_compiled,
        "primitive_s": primitive_s(repeats), "memory": mem,
    }


def format_phases(phases_: dict) -> list[str]:
    """Each phase: host and evaluation times, map synchronisations, the
    primitives by kind, and the host time by category."""
    lines = []
    for name, (host, ev, acc, calls, syncs, nodes) in phases_.items():
        kinds = ", ".join(f"{k} {v}" for k, v in nodes.most_common())
        lines.append(f"-- {name}: host graph building {host*1e3:.1f} ms, eval {ev*1e3:.1f} ms, "
                     f"map synchronisations {sum(syncs.values())} {syncs}")
        lines.append(f"   {sum(nodes.values())} primitives in the step's graph: {kinds}")
        if acc:
            lines.append("   host by category (a second build, under per-layer timers that add their own cost):")
        for label in sorted(acc, key=lambda k: -acc[k]):
            lines.append(f"   {label:<24} {calls[label]:>4} calls {acc[label]*1e3:>8.2f} ms host")
    return lines


def format_profile(p: dict) -> str:
    """The backend-neutral part of a profile as text."""
    lines = [
        f"step with maps built: {p['step_built_s']*1e3:.1f} ms; with maps cached: {p['step_cached_s']*1e3:.1f} ms",
        f"Adam alone {p['adam_s']*1e3:.1f} ms (compiled: {p['adam_compiled_s']*1e3:.1f} ms)",
        f"one small primitive (a chain of 1000 adds): {p['primitive_s']*1e6:.1f} us",
        format_memory(p["memory"]),
        *format_phases(p["phases"]),
    ]
    return "\n".join(lines)


def phases_json(phases_: dict) -> dict:
    """The phases as JSON-ready dicts."""
    return {k: dict(host_s=v[0], eval_s=v[1], host_by_category_s=v[2], calls=v[3], syncs=v[4],
                    primitives=dict(v[5])) for k, v in phases_.items()}


def cpu_name() -> str:
    """This machine's processor, as lscpu (or the platform) names it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_cpu_profile(args) -> int:
    """``--profile`` on the CPU: the step profile of MinkUNet 0.5x on the
    first workload, per dtype (float32 by default)."""
    from .. import num_threads
    from .training_step import TrainingStep
    from .workloads import DTYPES, workload

    wl = (args.workloads or "lidar").split(",")[0]
    coords, desc = workload(wl, args.quick)
    results = []
    for dt in (args.dtypes or "float32").split(","):
        print(f"-- MinkUNet {args.width}x {dt} training step on the CPU ({cpu_name()}, {num_threads()} threads), "
              f"{desc}: {len(coords):,} voxels", flush=True)
        p = profile(TrainingStep(coords, width=args.width, dtype=DTYPES[dt]), args.repeats or 3)
        print(format_profile(p), flush=True)
        results.append(dict(workload=wl, width=args.width, dtype=dt, **{
            k: v for k, v in p.items() if k != "phases"}, phases=phases_json(p["phases"])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0
