"""Synthetic and file-based point clouds for demos, tests and benchmarks.

The generators produce the kinds of inputs sparse 3D convolution is used on
in practice:

* :func:`lidar_sweep` (``lidar``) -- one revolution of a simulated 64-beam
  rotating LiDAR in a procedural street, with the ring structure, range-
  dependent density, occlusion shadows and mixed surface orientations of a
  real driving scan.
* :func:`surface_voxels` (``mesh``) -- a closed triangle mesh voxelized as a
  thin shell (the typical ShapeNet / ScanNet style input).
* :func:`uniform_random` (``voxels``) -- unstructured unique voxels, a worst
  case for neighbourhood reuse.

Helpers convert points to integer voxel coordinates
(:func:`voxelize_points`), measure how connected a voxel set is
(:func:`neighbour_stats`) and read point clouds or meshes from disk
(:func:`load_points`, :func:`load_ply`; ``ply``).

Coordinates are returned as ``(N, 4)`` int32 arrays with rows
``(batch, x, y, z)``, unique and sorted lexicographically.
"""

from .lidar import SENSOR_HEIGHT, hdl64_elevations, lidar_sweep
from .mesh import mesh_surface_points, procedural_closed_mesh, surface_voxels
from .ply import load_ply, load_points, save_ply
from .voxels import neighbour_counts, neighbour_stats, uniform_random, voxelize_points

__all__ = [
    "SENSOR_HEIGHT",
    "lidar_sweep",
    "hdl64_elevations",
    "voxelize_points",
    "neighbour_counts",
    "neighbour_stats",
    "mesh_surface_points",
    "procedural_closed_mesh",
    "surface_voxels",
    "uniform_random",
    "load_ply",
    "save_ply",
    "load_points",
]
