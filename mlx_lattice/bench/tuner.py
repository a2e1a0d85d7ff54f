"""Pre-tuning a model's shapes and timing the tuned routes against the
static order.

``python -m mlx_lattice tune [scan] [--width 0.5] [--budget 120]`` runs
MinkUNet training steps on a scan (a point file, or the synthetic LiDAR
sweep) in ``tune`` mode, so that every convolution shape of the model (its
forward, input-gradient and weight-gradient products) is measured once and
written to the tuning cache, and prints what was chosen.

:func:`compare_steps` (``python -m mlx_lattice.bench.network --tuner``)
times the same training step with the static order and with the tuned
choices in one process, steps of the two interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import mlx.core as mx

from .. import backends, scenes, tuning
from ..demo import _auto_voxel_size
from .training_step import TrainingStep
from .workloads import workload


def _coords(args):
    if getattr(args, "path", None):
        points = scenes.load_points(args.path, seed=0)
        size = args.voxel_size or _auto_voxel_size(points)
        return scenes.voxelize_points(points, size), f"{os.path.basename(args.path)}, {size:g} voxels"
    return workload(args.workload, quick=False)


def _dtype(name: str):
    return {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}[name]


def _run_steps(step, steps: int, inference: bool) -> None:
    for _ in range(steps):
        if inference:
            mx.eval(step.model(step.tensor()).feats)
        else:
            step()


def tune_model(coords, width=0.5, dtype=mx.float32, steps=1, inference=False, budget_s=120.0,
               cache_path=None, max_candidates=None):
    """Measure every convolution shape of a MinkUNet step on `coords` into
    the cache; returns (decisions of this process, seconds spent measuring,
    seconds of the whole run)."""
    step = TrainingStep(coords, width=width, dtype=dtype, master_weights=True)  # finite values to compare
    if inference:
        step.model.eval()
    kw = {"mode": "tune", "budget_s": budget_s, "cache_path": cache_path}
    if max_candidates:
        kw["max_candidates"] = max_candidates
    before = tuning.spent_s()
    t0 = time.perf_counter()
    with tuning.using(**kw):
        _run_steps(step, steps, inference)
    return tuning.decisions(), tuning.spent_s() - before, time.perf_counter() - t0


def compare_steps(coords, width=0.5, dtype=mx.float32, repeats=3, budget_s=120.0, cache_path=None) -> dict:
    """Milliseconds (best and median of `repeats`) of a MinkUNet training
    step with the static order (mode off) and with tuned choices (mode
    cached, after a tuning step on the same data), steps of the two
    interleaved in alternating order so that a shared machine's load hits
    both alike, and the median of each pair's static / tuned ratio. Without
    `cache_path` the choices go to a fresh temporary cache, so that no
    earlier cache takes part."""
    tmp = None
    if cache_path is None:
        tmp = tempfile.TemporaryDirectory(prefix="mlx_lattice_tune_")
        cache_path = os.path.join(tmp.name, "tuning.json")
    try:
        # Finite values over every step: the tuner checks each candidate's
        # output against the static route's.
        step = TrainingStep(coords, width=width, dtype=dtype, master_weights=True)
        with tuning.using(mode="off"):
            step()  # first-call costs (allocations, kernels) off the record
        before = tuning.spent_s()
        t0 = time.perf_counter()
        with tuning.using(mode="tune", budget_s=budget_s, cache_path=cache_path):
            step()
        tuning_step = time.perf_counter() - t0
        spent = tuning.spent_s() - before
        times = {"off": [], "cached": []}
        for i in range(repeats):
            for m in ("off", "cached") if i % 2 == 0 else ("cached", "off"):
                with tuning.using(mode=m, cache_path=cache_path):
                    t0 = time.perf_counter()
                    step()
                    times[m].append(time.perf_counter() - t0)
        decisions = [d for d in tuning.decisions() if d.source in ("tuner", "cache")]
        ratios = sorted(a / b for a, b in zip(times["off"], times["cached"]))
        return {
            "static_ms": min(times["off"]) * 1e3, "tuned_ms": min(times["cached"]) * 1e3,
            "static_median_ms": statistics.median(times["off"]) * 1e3,
            "tuned_median_ms": statistics.median(times["cached"]) * 1e3,
            "paired_ratio_median": statistics.median(ratios), "repeats": repeats,
            "tuning_step_ms": tuning_step * 1e3, "measuring_ms": spent * 1e3,
            "decisions": decisions, "changed": [d for d in decisions if d.label != d.static],
            "device": _device(),
        }
    finally:
        if tmp is not None:
            tmp.cleanup()


def _device() -> str:
    backend = backends.current()
    return tuning.device_id(backend.name, backend.tier())


def format_comparison(res: dict, title: str) -> str:
    lines = [
        f"{title} on {res['device']}",
        f"  {res['repeats']} steps each, interleaved: static order best {res['static_ms']:.1f} ms, median "
        f"{res['static_median_ms']:.1f} ms; tuned best {res['tuned_ms']:.1f} ms, median "
        f"{res['tuned_median_ms']:.1f} ms; static / tuned: best {res['static_ms'] / res['tuned_ms']:.3f}, "
        f"median of pairs {res['paired_ratio_median']:.3f}",
        f"  the tuning step took {res['tuning_step_ms']:.0f} ms, {res['measuring_ms']:.0f} ms of it measuring",
        f"  {len(res['decisions'])} shapes had more than one eligible route; the tuner changed "
        f"{len(res['changed'])}:",
    ]
    if res["decisions"]:
        lines += ["  " + ln for ln in tuning.table(res["decisions"]).splitlines()]
    return "\n".join(lines)


def _show(path, as_json: bool) -> int:
    """``tune --show``: the file's usable entries (stdout), and what it holds
    that cannot be used, with why (stderr under --json)."""
    rep = tuning.cache_report(path)
    items, unusable = rep["decisions"], rep["unusable"]
    notes = []
    if rep["state"] not in ("missing", "ok"):
        notes.append(f"{rep['path']}: {rep['reason']}; not read (python -m mlx_lattice tune replaces it)")
    if unusable:
        notes.append(f"{len(unusable)} entries cannot be used (python -m mlx_lattice tune drops them):")
        notes += [f"  {key}: {why}" for key, why in sorted(unusable.items())]
    if as_json:
        print(json.dumps([vars(d) for d in items], indent=2, default=list))
        for line in notes:
            print(line, file=sys.stderr)
        return 0
    print(f"{rep['path']}: {len(items)} entries")
    if items:
        print(tuning.table(items))
    for line in notes:
        print(line)
    return 0


def main(args) -> int:
    """``python -m mlx_lattice tune`` (arguments parsed by __main__)."""
    path = args.cache
    where = tuning.TuningCache(path).path
    if args.clear:
        try:
            n = tuning.TuningCache(path).remove()
        except OSError as e:
            print(f"tune: cannot clear {where}: {e}", file=sys.stderr)
            return 1
        print(f"removed {n} entries from {where}")
        return 0
    if args.show:
        return _show(path, args.json)
    bad = [f"--{name.replace('_', '-')} must be {what}, got {v!r}" for name, v, ok, what in (
        ("budget", args.budget, args.budget >= 0, "a number of seconds >= 0"),
        ("steps", args.steps, args.steps >= 1, "at least 1"),
        ("max_candidates", args.max_candidates, args.max_candidates is None or args.max_candidates >= 2,
         "at least 2"),
        ("width", args.width, args.width > 0, "positive")) if not ok]
    if bad:
        print("tune: " + "; ".join(bad), file=sys.stderr)
        return 2
    # What the cache holds that this release cannot use goes first: a file
    # of another format is replaced, malformed and stale entries dropped,
    # so that the run measures their shapes once and for good.
    try:
        fixed = tuning.repair_cache(path)
    except OSError as e:
        print(f"tune: cannot write the tuning cache {where}: {e}", file=sys.stderr)
        return 1
    out = sys.stderr if args.json else sys.stdout
    if fixed["replaced"]:
        print(f"{where}: replaced by an empty cache ({fixed['replaced']})", file=out)
    if fixed["dropped"]:
        print(f"{where}: dropped {len(fixed['dropped'])} entries this release cannot use:", file=out)
        for key, why in sorted(fixed["dropped"].items()):
            print(f"  {key}: {why}", file=out)
    if args.device == "gpu":
        mx.set_default_device(mx.gpu)
    coords, desc = _coords(args)
    print(f"tuning a MinkUNet {args.width}x {'inference' if args.inference else 'training'} step, {desc}: "
          f"{len(coords):,} voxels, {args.dtype}, budget {args.budget:g} s", file=out, flush=True)
    decisions, spent, total = tune_model(
        coords, width=args.width, dtype=_dtype(args.dtype), steps=args.steps, inference=args.inference,
        budget_s=args.budget, cache_path=path, max_candidates=args.max_candidates,
    )
    chosen = [d for d in decisions if d.source in ("tuner", "cache")]
    if args.json:
        print(json.dumps([vars(d) for d in chosen], indent=2, default=list))
        return 0
    print(f"{len(chosen)} shapes with more than one eligible route ({spent:.1f} s measuring, {total:.1f} s in all); "
          f"{sum(d.label != d.static for d in chosen)} take another route than the static order; "
          f"cache: {tuning.TuningCache(path).path}")
    if chosen:
        print(tuning.table(chosen))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", help=".npy/.ply/.bin point file (default: --workload)")
    p.add_argument("--workload", default="lidar", help="lidar, mesh or random (without a path; as the bench)")
    p.add_argument("--voxel-size", type=float, help="with a path: default automatic")
    p.add_argument("--width", type=float, default=0.5, help="MinkUNet width (default 0.5)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--steps", type=int, default=1, help="steps to run (the first measures)")
    p.add_argument("--inference", action="store_true", help="forward passes only (eval mode)")
    p.add_argument("--budget", type=float, default=120.0, help="seconds of measurement at most")
    p.add_argument("--max-candidates", type=int, help="routes and variants timed per shape (default 8)")
    p.add_argument("--cache", help="cache file (default $MLX_LATTICE_TUNE_CACHE or the user cache directory)")
    p.add_argument("--show", action="store_true", help="print the cache's entries and exit")
    p.add_argument("--clear", action="store_true", help="empty the cache and exit")
    p.add_argument("--json", action="store_true")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m mlx_lattice.bench.tuner")
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
