"""``python -m mlx_lattice demo``: a sparse encoder/decoder on a LiDAR sweep.

Builds a synthetic 64-beam sweep of a procedural street, voxelizes it, and
times forward and backward passes of a small U-Net made of the four sparse
convolution ops, printing the routes taken and the map-reuse statistics.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import mlx.core as mx

from . import diagnostics, num_threads, ops, scenes
from .tensor import SparseTensor

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}

# (name, kind, kernel, c_in, c_out)
LAYERS = [
    ("enc0a", "subm", 3, 4, 16),
    ("enc0b", "subm", 3, 16, 16),
    ("down1", "down", 2, 16, 32),
    ("enc1", "subm", 3, 32, 32),
    ("down2", "down", 2, 32, 64),
    ("enc2", "subm", 3, 64, 64),
    ("up1", "up", 2, 64, 32),
    ("dec1", "subm", 3, 32, 32),
    ("up0", "up", 2, 32, 16),
    ("dec0", "subm", 3, 16, 16),
    ("head", "point", 1, 16, 4),
]


def init_params(dtype, seed=0):
    rng = np.random.default_rng(seed)
    params = {}
    for name, _, k, c_in, c_out in LAYERS:
        std = np.sqrt(2.0 / (c_in * k**3))
        params[name] = {
            "w": mx.array(rng.normal(0, std, (c_out, k, k, k, c_in)).astype(np.float32)).astype(dtype),
            "b": mx.zeros((c_out,), dtype=dtype),
        }
    return params


def unet(params, x: SparseTensor) -> SparseTensor:
    def layer(name, t, act=True):
        kind = next(l[1] for l in LAYERS if l[0] == name)
        p = params[name]
        if kind == "subm":
            y = ops.subm_conv3d(t, p["w"], p["b"])
        elif kind == "down":
            y = ops.conv3d(t, p["w"], p["b"], stride=2)
        elif kind == "up":
            y = ops.conv_transpose3d(t, p["w"], p["b"], stride=2)
        else:
            y = ops.conv3d(t, p["w"], p["b"])
        return y.replace(mx.maximum(y.feats, 0)) if act else y

    s0 = layer("enc0b", layer("enc0a", x))
    s1 = layer("enc1", layer("down1", s0))
    s2 = layer("enc2", layer("down2", s1))
    u1 = layer("up1", s2, act=False)
    u1 = layer("dec1", u1.replace(mx.maximum(u1.feats + s1.feats, 0)))
    u0 = layer("up0", u1, act=False)
    u0 = layer("dec0", u0.replace(mx.maximum(u0.feats + s0.feats, 0)))
    return layer("head", u0, act=False)


def voxel_features(points, intensity, coords, voxel_size):
    """Per voxel: mean height, mean intensity, range, and point count (log)."""
    q = np.floor(points / voxel_size).astype(np.int64)
    _, inverse, counts = np.unique(q, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.ravel()
    n = len(counts)
    z = np.bincount(inverse, points[:, 2], n) / counts
    inten = np.bincount(inverse, intensity, n) / counts
    rng_m = np.bincount(inverse, np.linalg.norm(points[:, :2], axis=1), n) / counts
    feats = np.stack([z / 3.0, inten, rng_m / 50.0, np.log1p(counts) / 3.0], 1).astype(np.float32)
    labels = np.digitize(z, [-1.5, -0.5, 1.5]).astype(np.int32)  # ground, low, mid, high
    assert n == len(coords)
    return feats, labels


def run(args) -> int:
    dtype = DTYPES[args.dtype]
    t0 = time.perf_counter()
    points, intensity = scenes.lidar_sweep(seed=args.seed)
    t_scene = time.perf_counter() - t0
    t0 = time.perf_counter()
    coords = scenes.voxelize_points(points, args.voxel_size)
    feats, labels = voxel_features(points, intensity, coords, args.voxel_size)
    t_vox = time.perf_counter() - t0
    print(
        f"scene: synthetic 64-beam LiDAR sweep (seed {args.seed}): {len(points):,} points, "
        f"{len(coords):,} voxels at {args.voxel_size} m, "
        f"{scenes.neighbour_stats(coords):.2f} occupied neighbours of 26 on average"
    )
    print(f"       ray casting {t_scene:.2f} s, voxelization {t_vox:.2f} s; {num_threads()} CPU threads; dtype {args.dtype}")

    params = init_params(dtype, args.seed)
    labels_mx = mx.array(labels)

    def loss_fn(params, x):
        logits = unet(params, x).feats.astype(mx.float32)
        lse = mx.logsumexp(logits, axis=1)
        picked = mx.take_along_axis(logits, labels_mx[:, None], axis=1)[:, 0]
        return (lse - picked).mean()

    grad_fn = mx.value_and_grad(loss_fn)
    rows = []
    log = None
    for step in range(max(1, args.steps)):
        x = SparseTensor(coords, mx.array(feats).astype(dtype))
        with diagnostics.record() as log:
            t0 = time.perf_counter()
            out = unet(params, x)
            t_build = time.perf_counter() - t0  # graph + relation building
            mx.eval(out.feats)
            t_fwd = time.perf_counter() - t0
            t0 = time.perf_counter()
            loss, grads = grad_fn(params, x)
            mx.eval(loss, grads)
            t_fb = time.perf_counter() - t0
        stats = x.manager.stats()
        rows.append((step, t_build, t_fwd, t_fb, float(loss), stats))
        print(
            f"step {step}: maps+graph {t_build * 1e3:7.1f} ms | forward {t_fwd * 1e3:7.1f} ms | "
            f"forward+backward {t_fb * 1e3:7.1f} ms | loss {float(loss):.4f} | "
            f"maps built {stats['builds']}, reused {stats['hits']} ({stats['build_seconds'] * 1e3:.1f} ms building)"
        )
    print()
    print("routes taken (the last step: a forward pass, then forward+backward):")
    counts = Counter((r["op"], r["map_kind"], r["route"], r["backend"], r["k"], r["c_in"], r["c_out"], r["n_out"], r["edges"]) for r in log)
    header = ("op", "map kind", "route", "backend", "K", "C_in->C_out", "n_out", "edges", "calls")
    table = [header] + [
        (op, kind, route, backend, str(k), f"{ci}->{co}", f"{n:,}", f"{e:,}", str(c))
        for (op, kind, route, backend, k, ci, co, n, e), c in counts.items()
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for i, r in enumerate(table):
        print("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))
    if args.route_log:
        log.dump(args.route_log)
        print(f"\nroute records written to {args.route_log}")
    return 0
