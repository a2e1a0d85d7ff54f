"""Quick statistics: python -m mlx_lattice.scenes [seed]"""

import sys
import time

from . import lidar_sweep, neighbour_stats, voxelize_points

seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
t0 = time.perf_counter()
pts, inten = lidar_sweep(seed)
dt = time.perf_counter() - t0
print(f"lidar_sweep(seed={seed}): {len(pts)} points in {dt:.2f} s")
for vs in (0.05, 0.1, 0.2):
    c = voxelize_points(pts, vs)
    print(f"  voxel {vs:.2f} m: {len(c)} voxels, {neighbour_stats(c):.2f} neighbours / 26")
