"""``python -m mlx_lattice demo [PATH]``: MinkUNet on a voxelized scene.

Voxelizes a scene (by default a synthetic 64-beam LiDAR sweep of a
procedural street; or a ``.npy``/``.ply``/``.bin`` point file or mesh),
times MinkUNet forward and backward passes, fits the network to the scene's
labels for a few Adam steps, reads the predictions back at the points, and
writes a bird's-eye picture (input height | predicted class | label). Prints
the time per stage, the routes taken and the map-reuse statistics.

Labels: ground / wall / object (:mod:`mlx_lattice.tasks`) for the sweep;
height terciles (low / middle / high) for a file, whose semantics are
unknown.
"""

from __future__ import annotations

import os
import time
from collections import Counter

import numpy as np
import mlx.core as mx
import mlx.nn as mnn
from mlx.utils import tree_flatten

from . import diagnostics, num_threads, optimizers, scenes, tasks
from ._png import write_png
from .models import MinkUNet
from .points import devoxelize, sparse_quantize

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
CLASS_COLOURS = np.array([[120, 120, 120], [235, 125, 45], [70, 160, 240]], dtype=np.uint8)
TARGET_VOXELS = 60_000  # file inputs: the automatic voxel size aims here
PANEL = 1000  # pixels along a panel's longer side


def _say(msg: str = "") -> None:
    print(msg, flush=True)


class _Stages:
    """Wall time per named stage, in order."""

    def __init__(self):
        self.rows: list[tuple[str, float]] = []
        self.t0 = time.perf_counter()

    def add(self, name: str, seconds: float) -> None:
        self.rows.append((name, seconds))

    def total(self) -> float:
        return time.perf_counter() - self.t0


# ---------------------------------------------------------------- data
def _auto_voxel_size(points: np.ndarray) -> float:
    """A voxel size giving about TARGET_VOXELS voxels (surfaces: N ~ 1/size^2)."""
    extent = float(np.ptp(points, axis=0).max()) or 1.0
    size = extent / 256.0
    for _ in range(2):
        n = len(sparse_quantize(points, size))
        size *= float(np.sqrt(n / TARGET_VOXELS))
    return float(f"{size:.3g}")


def _load_scene(args):
    if args.path:
        points = scenes.load_points(args.path, seed=args.seed)
        name = f"{os.path.basename(args.path)}: {len(points):,} points"
        return points, None, name
    points, intensity = scenes.lidar_sweep(seed=args.seed)
    return points, intensity, f"synthetic 64-beam LiDAR sweep (seed {args.seed}): {len(points):,} points"


def _tercile_labels(height: np.ndarray) -> np.ndarray:
    cuts = np.quantile(height, [1 / 3, 2 / 3]) if len(height) else [0, 0]
    return np.digitize(height, cuts).astype(np.int32)


# ---------------------------------------------------------------- picture
def _height_colours(h: np.ndarray) -> np.ndarray:
    """Blue -> teal -> yellow -> white over the 2nd..98th height percentiles."""
    if len(h) == 0:
        return np.zeros((0, 3), np.uint8)
    lo, hi = np.percentile(h, [2, 98])
    t = np.clip((h - lo) / max(hi - lo, 1e-9), 0, 1)
    stops = np.array([0.0, 0.35, 0.7, 1.0])
    anchors = np.array([[40, 30, 110], [30, 150, 150], [240, 220, 60], [255, 255, 255]], np.float64)
    return np.stack([np.interp(t, stops, anchors[:, c]) for c in range(3)], 1).astype(np.uint8)


def _panel(xy: np.ndarray, z: np.ndarray, colours: np.ndarray, bounds, scale: float, dot: int) -> np.ndarray:
    """Top-down view: each voxel a dot x dot square; where they overlap, the highest wins."""
    (x0, x1), (y0, y1) = bounds
    w, h = int(np.ceil((x1 - x0) * scale)), int(np.ceil((y1 - y0) * scale))
    img = np.full((h, w, 3), 18, np.uint8)
    col = ((xy[:, 0] - x0) * scale).astype(np.int64)
    row = ((y1 - xy[:, 1]) * scale).astype(np.int64)  # +y up
    order = np.argsort(z, kind="stable")  # higher voxels drawn last
    for dr in range(dot):
        for dc in range(dot):
            r, c = row + dr, col + dc
            ok = (c >= 0) & (c < w) & (r >= 0) & (r < h)
            o = order[ok[order]]
            img[r[o], c[o]] = colours[o]
    return img


def _bounds(centres: np.ndarray, limit: float | None):
    """x/y extent of the voxels (1st..99th percentile, within +-limit)."""
    if len(centres) == 0:
        return ((-1.0, 1.0), (-1.0, 1.0))
    lo = np.percentile(centres[:, :2], 0.5, axis=0)
    hi = np.percentile(centres[:, :2], 99.5, axis=0)
    if limit is not None:
        lo, hi = np.maximum(lo, -limit), np.minimum(hi, limit)
    pad = 0.02 * float((hi - lo).max()) + 1e-6
    return ((lo[0] - pad, hi[0] + pad), (lo[1] - pad, hi[1] + pad))


def _picture(path, centres, height, pred, labels, bounds, scale, dot) -> tuple[int, int]:
    """Three panels (height | predicted class | label), stacked along the
    panels' shorter side; returns the image size (width, height)."""
    xy, z = centres[:, :2], centres[:, 2]
    panels = [
        _panel(xy, z, _height_colours(height), bounds, scale, dot),
        _panel(xy, z, CLASS_COLOURS[pred], bounds, scale, dot),
        _panel(xy, z, CLASS_COLOURS[labels], bounds, scale, dot),
    ]
    h, w, _ = panels[0].shape
    axis = 0 if w >= h else 1
    gap = np.full((6, w, 3) if axis == 0 else (h, 6, 3), 255, np.uint8)
    image = np.concatenate([panels[0], gap, panels[1], gap, panels[2]], axis=axis)
    write_png(path, image)
    return image.shape[1], image.shape[0]


# ---------------------------------------------------------------- route table
def _route_table(log) -> list[str]:
    counts = Counter(
        (r["op"], r["map_kind"], r["route"], r["backend"], r["k"], r["c_in"], r["c_out"], r["n_out"], r["edges"])
        for r in log
    )
    header = ("op", "map kind", "route", "backend", "K", "C_in->C_out", "n_out", "edges", "calls")
    table = [header] + [
        (op, kind, route, backend, str(k), f"{ci}->{co}", f"{n:,}", f"{e:,}", str(c))
        for (op, kind, route, backend, k, ci, co, n, e), c in counts.items()
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = []
    for i, r in enumerate(table):
        lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
        if i == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return lines


# ---------------------------------------------------------------- run
def run(args) -> int:
    stages = _Stages()
    dtype = DTYPES[args.dtype]
    path = args.path

    _say("[1/6] scene")
    t0 = time.perf_counter()
    points, intensity, scene_name = _load_scene(args)
    stages.add("scene", time.perf_counter() - t0)
    _say(f"      {scene_name} ({stages.rows[-1][1]:.2f} s)")

    _say("[2/6] voxelize")
    t0 = time.perf_counter()
    if path:
        voxel_size = args.voxel_size or _auto_voxel_size(points)
        ground_z = float(np.percentile(points[:, 2], 1)) if len(points) else 0.0
        sample = tasks.street_segmentation(voxel_size=voxel_size, points=points, ground_z=ground_z)
        height = np.array(sample.x.feats[:, 0]).astype(np.float64) * 3.0
        labels = _tercile_labels(height)
        class_names = ("low", "middle", "high")
    else:
        voxel_size = args.voxel_size or 0.1
        sample = tasks.street_segmentation(points=points, intensity=intensity, voxel_size=voxel_size)
        height = np.array(sample.x.feats[:, 0]).astype(np.float64) * 3.0
        labels = sample.labels
        class_names = tasks.CLASS_NAMES
    x = sample.x.astype(dtype)
    coords = np.array(x.coords)
    stages.add("voxelize + labels", time.perf_counter() - t0)
    shares = " / ".join(f"{n} {s:.0%}" for n, s in zip(class_names, np.bincount(labels, minlength=3) / max(len(labels), 1)))
    _say(
        f"      {len(x):,} voxels of size {voxel_size:g}{'' if path else ' m'}, {scenes.neighbour_stats(coords):.2f} occupied "
        f"neighbours of 26; features: height, intensity, range, log count; labels {shares} "
        f"({stages.rows[-1][1]:.2f} s)"
    )

    mx.random.seed(args.seed)
    model = MinkUNet(in_channels=x.feats.shape[1], num_classes=3, width=args.width)
    if dtype != mx.float32:
        model.set_dtype(dtype)
    n_params = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
    labels_mx = mx.array(labels)

    def loss_fn(m, t):
        logits = m(t).feats.astype(mx.float32)  # the loss in float32
        return mnn.losses.cross_entropy(logits, labels_mx, reduction="mean")

    value_and_grad = mnn.value_and_grad(model, loss_fn)

    def grad_fn(t):
        return value_and_grad(model, t)

    _say(f"[3/6] MinkUNet {args.width:g}x ({n_params / 1e6:.2f}M parameters, {args.dtype}, "
         f"{num_threads()} CPU threads): forward and backward")
    model.eval()
    t0 = time.perf_counter()
    mx.eval(model(x).feats)
    t_first = time.perf_counter() - t0
    build_first = x.manager.stats()
    t0 = time.perf_counter()
    mx.eval(model(x).feats)
    t_again = time.perf_counter() - t0
    stages.add("forward, maps built", t_first)
    stages.add("forward, maps reused", t_again)
    _say(f"      forward {t_first:.2f} s building {build_first['builds']} maps "
         f"({build_first['build_seconds'] * 1e3:.0f} ms of it), then {t_again:.2f} s reusing them")
    model.train()
    log = None
    fb_times = []
    for step in range(max(1, args.steps)):
        with diagnostics.record() as log:
            t0 = time.perf_counter()
            loss, grads = grad_fn(x)
            mx.eval(loss, grads)
            fb_times.append(time.perf_counter() - t0)
        _say(f"      forward+backward {step}: {fb_times[-1]:.2f} s, loss {float(loss):.4f}")
    stages.add(f"forward+backward (best of {len(fb_times)})", min(fb_times))

    _say(f"[4/6] fit to the labels: Adam, {args.train_steps} steps")
    optimizer = optimizers.Adam(learning_rate=args.lr)
    if dtype != mx.float32:
        # Half-precision passes, float32 master weights and Adam state: Adam
        # on float16 parameters would underflow (NaN from the second step).
        optimizer = optimizers.MixedPrecision(optimizer)
    update = optimizers.compiled_update(model, optimizer)
    t0 = time.perf_counter()
    curve = []
    for step in range(args.train_steps):
        loss, grads = grad_fn(x)
        update(grads)
        mx.eval(loss, model.state, optimizer.state)
        curve.append(float(loss))
        if step % 5 == 0 or step == args.train_steps - 1:
            _say(f"      step {step:3d}  loss {curve[-1]:.4f}  ({time.perf_counter() - t0:5.1f} s)")
    stages.add(f"training ({args.train_steps} steps)", time.perf_counter() - t0)

    _say("[5/6] predict and read back at the points")
    # Batch norm keeps normalising with this scene's statistics: after a few
    # steps its running averages have not settled yet.
    t0 = time.perf_counter()
    logits = model(x)
    pred = np.array(mx.argmax(logits.feats, axis=1)).astype(np.int64)
    stages.add("predict", time.perf_counter() - t0)
    t0 = time.perf_counter()
    point_logits = devoxelize(logits, sample.points, voxel_size, mode="trilinear")
    point_pred = np.array(mx.argmax(point_logits, axis=1))
    stages.add("devoxelize (trilinear)", time.perf_counter() - t0)
    acc = float((pred == labels).mean()) if len(labels) else 0.0
    point_acc = float((point_pred == labels[sample.point_to_voxel]).mean()) if len(labels) else 0.0
    iou = []
    for c in range(3):
        inter = np.sum((pred == c) & (labels == c))
        union = np.sum((pred == c) | (labels == c))
        iou.append(inter / union if union else float("nan"))
    _say(f"      voxel accuracy {acc:.3f}, IoU " + ", ".join(f"{n} {v:.2f}" for n, v in zip(class_names, iou))
         + f"; point accuracy {point_acc:.3f} ({len(sample.points):,} points)")

    _say("[6/6] picture")
    t0 = time.perf_counter()
    centres = (coords[:, 1:] + 0.5) * voxel_size
    bounds = _bounds(centres, None if path else 40.0)  # the sweep: within 40 m of the sensor
    scale = PANEL / max(bounds[0][1] - bounds[0][0], bounds[1][1] - bounds[1][0])
    png = os.path.abspath(args.png)
    dot = int(min(16, max(2, np.ceil(voxel_size * scale))))
    size = _picture(png, centres, height, pred, labels, bounds, scale, dot)
    stages.add("picture", time.perf_counter() - t0)

    _say()
    _say("time per stage:")
    for name, sec in stages.rows:
        _say(f"  {name:<28} {sec:8.2f} s")
    _say()
    forward = [r for r in log if r.get("direction", "forward") == "forward"]
    backward = Counter((r.get("direction"), r["route"]) for r in log if r.get("direction", "forward") != "forward")
    _say("routes taken (one forward+backward step; the forward calls):")
    for line in _route_table(forward):
        _say(line)
    if backward:
        _say("  backward calls: " + ", ".join(f"{d} {route} x{n}" for (d, route), n in sorted(backward.items())))
    stats = x.manager.stats()
    calls = stats["builds"] + stats["hits"]
    _say()
    _say(
        f"map reuse: {stats['builds']} relations built once ({stats['build_seconds'] * 1e3:.0f} ms) on "
        f"{stats['coordinate_sets']} coordinate sets, reused {stats['hits']:,} times "
        f"({stats['hits'] / max(calls, 1):.1%} of {calls:,} map requests)"
    )
    if curve:
        picks = sorted({0, len(curve) // 4, len(curve) // 2, 3 * len(curve) // 4, len(curve) - 1})
        _say("training curve (step: loss): " + ", ".join(f"{i}: {curve[i]:.3f}" for i in picks))
    _say(
        f"picture: {png}\n"
        f"  {size[0]} x {size[1]} px, bird's-eye view of {bounds[0][1] - bounds[0][0]:.3g} x "
        f"{bounds[1][1] - bounds[1][0]:.3g} {'units' if path else 'm'}; panels: height | predicted class | "
        f"label; classes "
        + ", ".join(f"{n} {'grey' if i == 0 else 'orange' if i == 1 else 'blue'}" for i, n in enumerate(class_names))
    )
    if args.route_log:
        log.dump(args.route_log)
        _say(f"route records written to {args.route_log}")
    _say(f"total {stages.total():.1f} s")
    return 0
