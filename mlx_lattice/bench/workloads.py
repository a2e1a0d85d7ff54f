"""What the benches run on: the scenes (a synthetic 64-beam LiDAR street
sweep, the voxelized surface of a closed mesh, uniform random voxels), the
layer shapes of the layer tables, and the dtypes by name."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from .. import scenes

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


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
