"""A synthetic learning task on the procedural street scenes.

:func:`street_segmentation` voxelizes a LiDAR sweep from
:func:`mlx_lattice.scenes.lidar_sweep` and labels every voxel as

- ``ground`` (0): less than 0.25 m above the road surface (road, curbs,
  sidewalks, open ground);
- ``wall`` (1): part of a large vertical structure: a connected group of
  non-ground voxels (26-connectivity on a 0.2 m grid) at least 8 m long
  horizontally and 1.2 m tall (building facades, long walls and hedges);
- ``object`` (2): everything else above the ground (vehicles, trees,
  poles, pedestrians, short walls).

The labels come from the geometry alone, so a sparse network has to learn
them from local shape and context; the ground/wall/object split needs a
receptive field of several metres. Everything here is NumPy except the
returned tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import mlx.core as mx

from . import scenes
from .tensor import SparseTensor
from .points import voxelize

__all__ = ["CLASS_NAMES", "SegmentationSample", "street_segmentation", "street_labels", "connected_components"]

CLASS_NAMES = ("ground", "wall", "object")
GROUND_HEIGHT = 0.25  # metres above the road
WALL_LENGTH = 8.0
WALL_HEIGHT = 1.2
GROUPING_CELL = 0.2


@dataclass
class SegmentationSample:
    """One labelled scene.

    x: the voxels, features ``(height above road / 3, intensity,
    range / 50, log(1 + points) / 3)`` per voxel; labels: (N,) int32 class
    per voxel (rows of x); points (P, 3) and intensity (P,) the sweep;
    point_to_voxel (P,) each point's row in x; voxel_size in metres.
    """

    x: SparseTensor
    labels: np.ndarray
    points: np.ndarray
    intensity: np.ndarray
    point_to_voxel: np.ndarray
    voxel_size: float


def connected_components(cells: np.ndarray) -> np.ndarray:
    """Labels of the 26-connected components of unique integer cells (M, 3).

    Every cell gets the smallest index of a cell in its component. Label
    propagation over neighbour pairs found by binary search, with pointer
    jumping.
    """
    cells = np.asarray(cells, dtype=np.int64)
    m = len(cells)
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    lo = cells.min(axis=0) - 1
    span = cells.max(axis=0) - lo + 2
    key = ((cells[:, 0] - lo[0]) * span[1] + (cells[:, 1] - lo[1])) * span[2] + (cells[:, 2] - lo[2])
    order = np.argsort(key)
    sorted_key = key[order]
    a_parts, b_parts = [], []
    for dx in (-1, 0, 1):
        for dy in (-1, 0, 1):
            for dz in (-1, 0, 1):
                if (dx, dy, dz) <= (0, 0, 0):  # each unordered pair once
                    continue
                q = key + (dx * span[1] + dy) * span[2] + dz
                i = np.minimum(np.searchsorted(sorted_key, q), m - 1)
                hit = sorted_key[i] == q
                a_parts.append(np.flatnonzero(hit))
                b_parts.append(order[i[hit]])
    a = np.concatenate(a_parts)
    b = np.concatenate(b_parts)
    label = np.arange(m)
    while True:
        low = np.minimum(label[a], label[b])
        new = label.copy()
        np.minimum.at(new, a, low)
        np.minimum.at(new, b, low)
        new = new[new[new]]
        if np.array_equal(new, label):
            return label
        label = new


def street_labels(coords: np.ndarray, height: np.ndarray, voxel_size: float) -> np.ndarray:
    """Ground / wall / object per voxel from its coordinates (N, 4) and its
    mean point height above the road (N,); see the module docstring."""
    coords = np.asarray(coords, dtype=np.int64)
    labels = np.zeros(len(coords), dtype=np.int32)
    above = np.flatnonzero(height >= GROUND_HEIGHT)
    if len(above) == 0:
        return labels
    centre = (coords[above, 1:] + 0.5) * voxel_size
    cell = max(GROUPING_CELL, voxel_size)
    grid = np.concatenate([coords[above, :1], np.floor(centre / cell).astype(np.int64)], axis=1)
    cells, inverse = np.unique(grid, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    # components never join batch items: the batch index is a fourth axis
    # folded into x with a gap wider than one cell
    folded = cells[:, 1:].copy()
    folded[:, 0] += cells[:, 0] * (int(np.ptp(cells[:, 1])) + 4)
    _, comp = np.unique(connected_components(folded)[inverse], return_inverse=True)
    comp = comp.reshape(-1)
    n = int(comp.max()) + 1
    h = height[above]
    h_lo = np.full(n, np.inf)
    h_hi = np.full(n, -np.inf)
    np.minimum.at(h_lo, comp, h)
    np.maximum.at(h_hi, comp, h)
    length = np.zeros(n)
    for axis in (0, 1):
        lo = np.full(n, np.inf)
        hi = np.full(n, -np.inf)
        np.minimum.at(lo, comp, centre[:, axis])
        np.maximum.at(hi, comp, centre[:, axis])
        length = np.maximum(length, hi - lo)
    wall = (length >= WALL_LENGTH) & (h_hi - h_lo >= WALL_HEIGHT)
    labels[above] = np.where(wall[comp], 1, 2)
    return labels


def street_segmentation(seed=0, voxel_size=0.1, max_range=None, batch=0, points=None, intensity=None,
                        ground_z=None, manager=None) -> SegmentationSample:
    """A labelled voxelized LiDAR sweep (``scenes.lidar_sweep(seed)``).

    ``max_range`` (metres) keeps points within that horizontal distance of
    the sensor; ``points``/``intensity`` replace the generated sweep;
    ``ground_z`` is the height of the road in the points' frame (default
    ``-scenes.SENSOR_HEIGHT``, as in the sweep).
    """
    if points is None:
        points, intensity = scenes.lidar_sweep(seed=seed)
    points = np.asarray(points, dtype=np.float32)[:, :3]
    intensity = np.zeros(len(points), np.float32) if intensity is None else np.asarray(intensity, np.float32)
    if max_range is not None:
        keep = np.hypot(points[:, 0], points[:, 1]) < max_range
        points, intensity = points[keep], intensity[keep]
    ground_z = -scenes.SENSOR_HEIGHT if ground_z is None else float(ground_z)
    height = points[:, 2].astype(np.float64) - ground_z
    per_point = np.stack(
        [height / 3.0, intensity, np.linalg.norm(points[:, :2], axis=1) / 50.0], axis=1
    ).astype(np.float32)
    x, p2v = voxelize(points, per_point, voxel_size, batch=batch, manager=manager)
    p2v_np = np.array(p2v)
    counts = np.bincount(p2v_np, minlength=len(x)).astype(np.float32)
    feats = mx.concatenate([x.feats, mx.array(np.log1p(counts) / 3.0)[:, None]], axis=1)
    x = x.replace(feats)
    voxel_height = np.array(x.feats[:, 0]).astype(np.float64) * 3.0
    labels = street_labels(np.array(x.coords), voxel_height, voxel_size)
    return SegmentationSample(x, labels, points, intensity, p2v_np, voxel_size)
