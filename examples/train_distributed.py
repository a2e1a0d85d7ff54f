"""Data-parallel MinkUNet training on mx.distributed, started with mlx.launch.

    mlx.launch -n 2 examples/train_distributed.py                    # 2 processes, this machine
    mlx.launch --hostfile hosts.json examples/train_distributed.py   # several machines
    python examples/train_distributed.py                             # one process, same script

Every rank builds the same MinkUNet (SyncBatchNorm layers, rank 0's initial
weights), takes its shard of each global batch of procedural street sweeps
(``mlx_lattice.tasks.street_segmentation``) through
``mlx_lattice.distributed.ShardedSampler``, and averages gradients after each
step, so R ranks with ``--batch-size`` B train as one process with batch
size R * B. Rank 0 prints the global loss and throughput per step and alone
writes checkpoints. ``--backend`` picks the distributed backend (``ring``,
``mpi``, ``nccl``; ``any`` takes the first that starts, which is what
``mlx.launch`` set up).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import mlx.core as mx
import mlx.nn as mnn
import mlx.optimizers as optim

from mlx_lattice import distributed as dist
from mlx_lattice import nn, tasks
from mlx_lattice.models import MinkUNet


class StreetScenes:
    """Labelled sweeps ``(x, labels)`` made on first use (each rank builds only its own)."""

    def __init__(self, n, voxel_size, max_range, seed):
        self.n, self.voxel_size, self.max_range, self.seed = n, voxel_size, max_range, seed
        self.cache = {}

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i not in self.cache:
            s = tasks.street_segmentation(self.seed + i, self.voxel_size, max_range=self.max_range)
            self.cache[i] = (s.x, s.labels)
        return self.cache[i]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="any", help="ring, mpi, nccl or any (default)")
    p.add_argument("--scenes", type=int, default=8, help="training scenes in the dataset")
    p.add_argument("--batch-size", type=int, default=1, help="scenes per rank and step")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--voxel-size", type=float, default=0.2)
    p.add_argument("--max-range", type=float, default=30.0)
    p.add_argument("--width", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", help="folder for weights (rank 0 writes, after each epoch)")
    args = p.parse_args(argv)

    group = mx.distributed.init(backend=args.backend)
    rank, size = group.rank(), group.size()

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    mx.random.seed(args.seed + rank)  # different on purpose: broadcast_parameters aligns them
    data = StreetScenes(args.scenes, args.voxel_size, args.max_range, seed=args.seed + 1)
    sampler = dist.ShardedSampler(len(data), args.batch_size, group=group, seed=args.seed)
    model = MinkUNet(in_channels=4, num_classes=len(tasks.CLASS_NAMES), width=args.width)
    nn.convert_sync_batchnorm(model, group=group)
    dist.broadcast_parameters(model, group=group)
    optimizer = optim.Adam(learning_rate=args.lr)
    log(f"{size} rank(s) over {args.backend!r}, {len(data)} scenes, {len(sampler)} steps per epoch, "
        f"global batch {sampler.global_batch_size} scenes")

    def loss_fn(model, x, y):
        per_voxel = mnn.losses.cross_entropy(model(x).feats, y, reduction="none")
        return dist.global_mean(per_voxel, group=group)

    step_fn = mnn.value_and_grad(model, loss_fn)
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in dist.batches(data, sampler, collate=dist.collate_labelled):
            t0 = time.perf_counter()
            loss, grads = step_fn(model, x, y)
            grads = dist.average_gradients(grads, group=group)
            optimizer.update(model, grads)
            report = mx.stack([dist.mean_over_ranks(loss, group=group),
                               mx.distributed.all_sum(mx.array(float(len(x))), group=group)
                               if size > 1 else mx.array(float(len(x)))])
            mx.eval(report, model.parameters(), optimizer.state)
            seconds = time.perf_counter() - t0
            global_loss, voxels = np.array(report).tolist()
            log(f"epoch {epoch} step {step:4d}  loss {global_loss:.4f}  "
                f"{voxels / seconds:10,.0f} voxels/s  {sampler.global_batch_size / seconds:6.2f} scenes/s  "
                f"({seconds:.2f} s)")
            step += 1
        if args.checkpoint and rank == 0:
            os.makedirs(args.checkpoint, exist_ok=True)
            path = os.path.join(args.checkpoint, f"epoch{epoch:03d}.safetensors")
            model.save_weights(path)
            with open(os.path.join(args.checkpoint, "latest.json"), "w") as f:
                json.dump({"epoch": epoch, "step": step, "weights": os.path.basename(path), "ranks": size}, f)
            log(f"checkpoint {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
