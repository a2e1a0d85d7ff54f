"""A new process's start (``python -m mlx_lattice.bench --startup``):
import and the first two MinkUNet training steps, with empty and with warm
kernel caches, and on the GPU after ``cuda-prebuild``."""

from __future__ import annotations

import json
import os
import sys
import time

# One process's start: import, maps and the first two training steps of a
# MinkUNet 0.5x on the LiDAR sweep, each timed (run by run_startup).
_STARTUP = """
import json, sys, time
t0 = time.perf_counter()
import mlx.core as mx
import mlx_lattice
from mlx_lattice.bench.training_step import TrainingStep
from mlx_lattice.bench.workloads import DTYPES, workload
mx.set_default_device(mx.gpu if sys.argv[1] == "gpu" else mx.cpu)
t_import = time.perf_counter() - t0
coords, _ = workload("lidar", quick=False)
step = TrainingStep(coords, width=0.5, dtype=DTYPES[sys.argv[2]])
times = []
for _ in range(2):
    t = time.perf_counter()
    step()
    mx.synchronize()
    times.append(time.perf_counter() - t)
print(json.dumps({"import_s": t_import, "first_step_s": times[0], "second_step_s": times[1],
                  "voxels": len(coords)}))
"""


def run_startup(args) -> int:
    """The first training step of a new process, per dtype: with empty
    kernel caches (ours, MLX_LATTICE_CUDA_CACHE, and MLX's, MLX_PTX_CACHE_DIR:
    a first run on the machine), again with what that process left there
    (every later process) and, on the GPU, with fresh caches that
    ``cuda-prebuild`` filled (an install's build step; its time is shown)."""
    import subprocess
    import tempfile

    device = args.device
    print(f"mlx_lattice bench --startup ({device}): a new process's import and first two MinkUNet 0.5x "
          "training steps on the LiDAR sweep; cold = empty kernel cache, warm = the next process"
          + (", prebuilt = empty caches filled by cuda-prebuild" if device == "gpu" else ""), flush=True)
    rows = []
    states = ("cold", "warm", "prebuilt") if device == "gpu" else ("cold", "warm")
    for dt in (args.dtypes or "float32,float16").split(","):
        for state in states:
            if state != "warm":
                cache = tempfile.mkdtemp(prefix="mlx-kernel-cache-")
            env = dict(os.environ, MLX_PTX_CACHE_DIR=os.path.join(cache, "mlx"),
                       MLX_LATTICE_CUDA_CACHE=os.path.join(cache, "mlx_lattice"))
            build = None
            if state == "prebuilt":
                t = time.perf_counter()
                out = subprocess.run([sys.executable, "-m", "mlx_lattice", "cuda-prebuild", "--dtypes", dt],
                                     env=env, capture_output=True, text=True)
                build = time.perf_counter() - t
                if out.returncode != 0:
                    print(out.stdout[-2000:], out.stderr[-3000:], file=sys.stderr)
                    return 1
            t = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", _STARTUP, device, dt], env=env,
                                 capture_output=True, text=True)
            wall = time.perf_counter() - t
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row.update(dtype=dt, cache=state, process_s=wall, device=device, prebuild_s=build)
            rows.append(row)
            print(f"{dt:<9} {state:<8} import {row['import_s']:6.2f} s  first step {row['first_step_s']:7.2f} s  "
                  f"second step {row['second_step_s']:6.3f} s  whole process {wall:7.2f} s"
                  + (f"  (cuda-prebuild before it: {build:.1f} s)" if build is not None else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0
