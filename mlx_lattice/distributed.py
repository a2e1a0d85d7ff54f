"""Data-parallel training on ``mx.distributed``.

Every process (rank) holds the whole model, takes its own shard of each
global batch, and the ranks agree after every step by averaging gradients.
The pieces:

- :class:`ShardedSampler`: the batches of one rank, from a permutation of
  the dataset that every rank derives from the same seed and epoch (no
  communication), with the same number of steps on every rank.
- :func:`batches` / :func:`collate_labelled`: one rank's batches collated
  with :func:`mlx_lattice.sparse_collate`.
- :func:`global_mean`: a loss over ragged per-rank batches (different voxel
  counts per rank) scaled so that averaged gradients are those of the mean
  over the union of the batches.
- :func:`average_gradients` (``mlx.nn.average_gradients``),
  :func:`broadcast_parameters` (start every rank from rank 0's weights) and
  :func:`mean_over_ranks` (report a global figure).
- :class:`mlx_lattice.nn.SyncBatchNorm` and
  :func:`mlx_lattice.nn.convert_sync_batchnorm` for batch statistics over
  every rank.

The backend is whatever ``mx.distributed.init(backend=...)`` gives (ring over
TCP, MPI, NCCL on CUDA), started with ``mlx.launch``. With a single process
(no backend) every function here works on the singleton group, so the same
script runs unchanged on one process.
"""

from __future__ import annotations

import numpy as np
import mlx.core as mx
import mlx.nn as mnn
from mlx.utils import tree_map

from .algebra import sparse_collate
from .tensor import SparseTensor
from .nn.sync_batch_norm import SyncBatchNorm, convert_sync_batchnorm

__all__ = [
    "ShardedSampler",
    "batches",
    "collate_labelled",
    "global_mean",
    "mean_over_ranks",
    "average_gradients",
    "broadcast_parameters",
    "SyncBatchNorm",
    "convert_sync_batchnorm",
]


def _group(group):
    return mx.distributed.init() if group is None else group


def _all_sum(x, group):
    return x if group.size() == 1 else mx.distributed.all_sum(x, group=group)


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return int(value)


class ShardedSampler:
    """Indices of one rank's batches of a dataset of ``num_items`` items.

    Each epoch has one permutation of ``range(num_items)`` (seeded by
    ``(seed, epoch)``, identical on every rank; the identity when
    ``shuffle=False``). Step ``s`` takes the global batch
    ``order[s * G:(s + 1) * G]`` with ``G = batch_size * size``, and rank
    ``r`` takes its ``r``-th slice of ``batch_size`` items. Concatenating the
    ranks' batches in rank order gives the global batch, so R ranks with
    ``batch_size`` B visit the data exactly as one process with batch size
    ``R * B`` does.

    Every rank runs ``len(sampler)`` steps of exactly ``batch_size`` items:
    when ``num_items`` is not a multiple of ``G``, ``drop_last=True`` drops
    the incomplete last global batch (those items are skipped this epoch and
    met in other epochs when shuffled); ``drop_last=False`` (default) pads it
    with items from the start of the epoch's order (repeated in that
    epoch). ``drop_last=True`` with fewer than ``G`` items raises.

    ``rank`` / ``size`` default to those of ``group`` (default: the global
    group of ``mx.distributed.init()``). Call :meth:`set_epoch` before each
    epoch, or pass ``epoch`` to :meth:`indices`.
    """

    def __init__(self, num_items: int, batch_size: int, *, group=None, rank=None, size=None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False):
        self.num_items = _positive_int(num_items, "num_items")
        self.batch_size = _positive_int(batch_size, "batch_size")
        if (rank is None) != (size is None):
            raise ValueError("pass both rank and size, or neither (to take them from the group)")
        if rank is None:
            g = _group(group)
            rank, size = g.rank(), g.size()
        self.size = _positive_int(size, "size")
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.size:
            raise ValueError(f"rank must be an int in [0, {self.size}), got {rank!r}")
        self.rank = int(rank)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        g = self.global_batch_size
        if self.drop_last and self.num_items < g:
            raise ValueError(
                f"num_items ({self.num_items}) is smaller than one global batch "
                f"(batch_size {self.batch_size} x {self.size} ranks) and drop_last=True leaves no step"
            )

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.size

    def __len__(self) -> int:
        g = self.global_batch_size
        return self.num_items // g if self.drop_last else -(-self.num_items // g)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def global_order(self, epoch=None) -> np.ndarray:
        """The epoch's item order, cut or padded to ``len(self)`` global batches."""
        epoch = self.epoch if epoch is None else int(epoch)
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.num_items)
        else:
            order = np.arange(self.num_items)
        return np.resize(order, len(self) * self.global_batch_size)

    def indices(self, epoch=None) -> np.ndarray:
        """This rank's item indices for every step: ``(len(self), batch_size)``."""
        steps = self.global_order(epoch).reshape(len(self), self.size, self.batch_size)
        return steps[:, self.rank]

    def __iter__(self):
        return iter(list(self.indices()))


def batches(dataset, sampler: ShardedSampler, collate=sparse_collate, epoch=None):
    """This rank's batches of ``dataset`` (indexable) for one epoch:
    ``collate([dataset[i] for i in step])`` for each step of ``sampler``."""
    for step in sampler.indices(epoch):
        yield collate([dataset[int(i)] for i in step])


def collate_labelled(items):
    """Collate ``(x, labels)`` pairs: ``x`` a SparseTensor or ``(coords,
    feats)`` pair, ``labels`` one value per row of ``x``. Returns
    ``(sparse_collate(xs), labels)`` with the labels concatenated in the
    same row order (an ``mx.array``)."""
    items = list(items)
    xs, ys = [], []
    for i, item in enumerate(items):
        try:
            x, y = item
        except (TypeError, ValueError):
            raise TypeError(f"collate_labelled: item {i} must be an (x, labels) pair") from None
        y = np.asarray(y)
        rows = len(x) if isinstance(x, SparseTensor) else len(x[0])
        if y.ndim < 1 or len(y) != rows:
            raise ValueError(f"collate_labelled: item {i} has labels of shape {y.shape} for {rows} rows")
        xs.append(x)
        ys.append(y)
    return sparse_collate(xs), mx.array(np.concatenate(ys, axis=0))


def global_mean(values: mx.array, group=None) -> mx.array:
    """This rank's term of the mean of ``values`` over every rank's rows.

    Returns ``values.sum() * size / N`` with N the total number of rows on
    all ranks (exchanged, no gradient). Its gradients, averaged over the
    ranks by :func:`average_gradients`, are those of the mean over the
    union of the ranks' rows, which a plain per-rank ``mean`` gets wrong
    when ranks hold different numbers of rows. :func:`mean_over_ranks` of
    the returned value is that global mean. A collective: every rank calls
    it, including ranks with no rows.
    """
    g = _group(group)
    n = _all_sum(mx.array([values.size], dtype=mx.float32), g)[0]
    # an empty slice sums to a constant: on MLX 0.32's CPU backend a reduction
    # over an empty array can leave a later all-reduce waiting forever
    total = values.astype(mx.float32).sum() if values.size else mx.array(0.0)
    return total * (g.size() / mx.maximum(n, 1))


def mean_over_ranks(x, group=None):
    """The mean of ``x`` (an array or a tree of arrays) over the ranks."""
    g = _group(group)
    if g.size() == 1:
        return x
    return tree_map(lambda a: mx.distributed.all_sum(a, group=g) / g.size(), x)


def average_gradients(gradients, group=None, **kwargs):
    """``mlx.nn.average_gradients`` on ``group`` (default: the global group);
    ``kwargs`` pass through (``all_reduce_size``, ``communication_type``)."""
    return mnn.average_gradients(gradients, group=_group(group), **kwargs)


def broadcast_parameters(model: mnn.Module, group=None, root: int = 0) -> mnn.Module:
    """Give every rank ``root``'s parameters and buffers (running statistics
    included), so training starts from one set of weights; returns
    ``model``. A collective: every rank calls it."""
    g = _group(group)
    if not 0 <= root < g.size():
        raise ValueError(f"root must be a rank in [0, {g.size()}), got {root}")
    if g.size() == 1:
        return model
    mine = g.rank() == root
    # a sum where every other rank adds zeros is an exact copy
    params = tree_map(
        lambda p: mx.distributed.all_sum(p if mine else mx.zeros_like(p), group=g), model.parameters()
    )
    model.update(params)
    mx.eval(model.parameters())
    return model
