"""Where a training step's time goes on CUDA: the backend-neutral profile
(``profile``: host graph building against evaluation, primitives by kind,
host time by layer kind, memory) with the CUDA map builders' host
synchronisations counted, plus what only CUDA has here: the isolated time
of every convolution product the step runs, the stages of building one
layer's maps, and the evaluation floor of the step's primitives.

``python -m mlx_lattice.bench --device gpu --profile`` prints it. Times are
wall-clock between ``mx.eval`` boundaries (MLX queues work lazily: graph
building on the host and the device's work overlap only inside an eval).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import mlx.core as mx

from .. import autodiff, diagnostics, ops
from ..relation import KernelGeometry, Relation
from ..tensor import SparseTensor
from . import profile as shared
# The backend-neutral parts, also reached from here.
from .profile import format_memory, graph_nodes, host_timers, map_arrays, memory  # noqa: F401
from .timing import best_time


def cuda_backend():
    """mlx_lattice's CUDA backend package, its map builders loaded as
    ``.maps``: the benches' one import of it, made on first use (a GPU
    backend that the CPU benches never load)."""
    from ..backends import cuda
    from ..backends.cuda import maps  # noqa: F401  (reached as cuda.maps)

    return cuda


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
            native, plans, a, b = cuda.BACKEND.relation(table, dst, geom, False, kind)
            mx.eval(native.in_idx, native.k_idx, native.neighbor_map)
            return Relation(native, KernelGeometry(*geom), "cuda", plans, max_neighbors=a, max_in_neighbors=b)

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


def profile(step, repeats: int = 5) -> dict:
    """Profile of a TrainingStep (mlx_lattice/bench/training_step.py) on CUDA:
    ``profile.profile``'s, its map synchronisations counted, with the
    evaluation floor, the isolated products and the map stages."""
    maps = cuda_backend().maps
    p = shared.profile(step, repeats, reads=maps.READS)

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
    p["eval_floor_s"] = min(small_eval() for _ in range(repeats))
    p["products"] = conv_device_times(step, step.tensor(), repeats)
    p["map_stages_s"] = map_stages(step.coords, repeats)
    return p


def format_profile(p: dict) -> str:
    lines = [
        f"step with maps built: {p['step_built_s']*1e3:.1f} ms; with maps cached: {p['step_cached_s']*1e3:.1f} ms",
        *format_products(p["products"]),
        f"Adam alone {p['adam_s']*1e3:.1f} ms (compiled: {p['adam_compiled_s']*1e3:.1f} ms)",
        f"one small primitive (a chain of 1000 adds): {p['primitive_s']*1e6:.1f} us",
        f"evaluation of the step (maps cached) on every 16th row: {p['eval_floor_s']*1e3:.1f} ms "
        "(about what dispatching the step's primitives costs, whatever the rows)",
        format_memory(p["memory"]),
        "map stages (each evaluated on its own):",
    ]
    for name, t in p["map_stages_s"].items():
        lines.append(f"   {name:<44} {t*1e3:8.3f} ms")
    lines += shared.format_phases(p["phases"])
    return "\n".join(lines)
