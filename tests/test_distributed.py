"""Data parallelism: sampler, SyncBatchNorm, gradient averaging.

The two-process tests start this file as a script once per rank over MLX's
ring backend on 127.0.0.1 (a hostfile JSON as ``mlx.launch`` writes it, ports
found free by binding port 0). Each rank writes its results to an .npz; the
test compares them with one process running plain BatchNorm on the
concatenated batch. Ranks run under a deadline and a rank that exits with an
error stops the others at once.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import mlx.core as mx
import mlx.nn as mnn
import mlx.optimizers as optim
from mlx.utils import tree_flatten

import mlx_lattice as ml
from mlx_lattice import distributed as dist
from mlx_lattice import nn

SIZE = 2
BATCH = 2  # scenes per rank and step
SCENES = [23, 41, 9, 30, 17, 36, 28]  # voxels per scene: ragged, 7 = not a multiple of 4
LR = 0.1


# ------------------------------------------------------------ shared case
def scene(k):
    rng = np.random.default_rng(1000 + k)
    grid = np.stack(np.meshgrid(*[np.arange(6)] * 3, indexing="ij"), -1).reshape(-1, 3)
    coords = grid[np.sort(rng.choice(len(grid), SCENES[k], replace=False))]
    feats = (rng.standard_normal((len(coords), 3)) * [1.0, 3.0, 0.5] + [0.0, 4.0, -1.0]).astype(np.float32)
    return coords.astype(np.int32), feats


def make_model(seed):
    mx.random.seed(seed)
    return nn.Sequential(
        nn.SubmConv3d(3, 8, 3), nn.BatchNorm(8), nn.ReLU(),
        nn.Conv3d(8, 12, 2, stride=2), nn.BatchNorm(12), nn.ReLU(),
        nn.Linear(12, 5),
    )


def dtype_name(dtype):
    return str(dtype).rsplit(".", 1)[-1]


HEAD = np.linspace(-1.0, 1.0, 5).astype(np.float32)


def row_losses(model, x):
    y = model(x).feats
    return 0.5 * (y * y).sum(axis=1) + y @ mx.array(HEAD)


def bn_rows(rank_or_all, dtype):
    """Features per rank for the SyncBatchNorm checks: ragged, one rank empty
    in the second case."""
    rng = np.random.default_rng(7)
    sizes = [(37, 18), (0, 25)]
    out = []
    for case, per_rank in enumerate(sizes):
        parts = [(rng.standard_normal((n, 6)) * 2 + 5).astype(np.float32) for n in per_rank]
        cts = [rng.standard_normal((n, 6)).astype(np.float32) for n in per_rank]
        parts = [mx.array(p).astype(dtype) for p in parts]
        cts = [mx.array(c) for c in cts]
        if rank_or_all == "all":
            out.append((mx.concatenate(parts), mx.concatenate(cts)))
        else:
            out.append((parts[rank_or_all], cts[rank_or_all]))
    return out


def bn_run(bn, x, ct, scale):
    """Output, input gradient and weight/bias gradients of ``scale * sum(bn(x) * ct)``
    after two training calls (running statistics moved twice), then the eval output."""
    bn.train()
    bn(x)
    def f(params, x):
        bn.update(params)
        # padded with a zero: no reduction over an empty array (see _column_sums)
        return scale * mx.concatenate([(bn(x).astype(mx.float32) * ct).reshape(-1), mx.zeros(1)]).sum()
    params = bn.trainable_parameters()
    (dparams, dx) = mx.grad(f, argnums=(0, 1))(params, x)
    bn.update(params)
    y = bn(x)  # third training call
    bn.eval()
    y_eval = bn(x)
    return {"y": y, "dx": dx, "dw": dparams["weight"], "db": dparams["bias"],
            "running_mean": bn.running_mean, "running_var": bn.running_var, "y_eval": y_eval}


# ------------------------------------------------------------ one rank
def worker(out_dir):
    group = mx.distributed.init(backend="ring", strict=True)
    rank, size = group.rank(), group.size()
    assert size == SIZE
    res = {}

    # SyncBatchNorm against the concatenated batch, float32 and float16
    for dtype in (mx.float32, mx.float16):
        for case, (x, ct) in enumerate(bn_rows(rank, dtype)):
            bn = nn.SyncBatchNorm(6, momentum=0.3)
            r = bn_run(bn, x, ct, 1.0)
            # one eval for all: every rank runs the same exchanges in the same order
            # (converting an empty array alone would not evaluate its inputs)
            mx.eval(r)
            for k, v in r.items():
                res[f"bn/{dtype_name(dtype)}/{case}/{k}"] = np.array(v.astype(mx.float32))

    # one training step on each rank's shard
    model = dist.broadcast_parameters(nn.convert_sync_batchnorm(make_model(100 + rank)))
    res.update({f"init/{k}": np.array(v) for k, v in tree_flatten(model.parameters())})
    sampler = dist.ShardedSampler(len(SCENES), BATCH, shuffle=True, seed=5)
    x = next(dist.batches([scene(k) for k in range(len(SCENES))], sampler))

    def loss_fn(model, x):
        return dist.global_mean(row_losses(model, x))

    loss, grads = mnn.value_and_grad(model, loss_fn)(model, x)
    grads = dist.average_gradients(grads)
    opt = optim.SGD(learning_rate=LR)
    opt.update(model, grads)
    res["loss"] = np.array(dist.mean_over_ranks(loss))
    res.update({f"grad/{k}": np.array(v) for k, v in tree_flatten(grads)})
    res.update({f"param/{k}": np.array(v) for k, v in tree_flatten(model.parameters())})
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)


def failing_worker():
    # the other rank stays blocked in its first collective until it is stopped
    if int(os.environ["MLX_RANK"]) == 1:
        raise RuntimeError("rank 1 fails on purpose")
    group = mx.distributed.init(backend="ring", strict=True)
    mx.eval(mx.distributed.all_sum(mx.ones(3), group=group))


# ------------------------------------------------------------ launching
def free_ports(n):
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run_ranks(tmp_path, mode, timeout=60.0):
    """Start SIZE ranks of this file in ``mode`` and wait for them.

    Raises AssertionError (with the failed rank's output) as soon as a rank
    exits with an error or the deadline passes; every rank still running is
    killed first. A rank stuck in a collective dumps its stack (faulthandler)
    and exits shortly before the deadline."""
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(SIZE)]))
    procs, logs = [], []
    for rank in range(SIZE):
        env = dict(os.environ, MLX_RANK=str(rank), MLX_HOSTFILE=str(hostfile), RANK_TIMEOUT=str(timeout - 2))
        log = open(tmp_path / f"rank{rank}.log", "w+")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, __file__, mode, str(tmp_path)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                r = failed[0]
                logs[r].seek(0)
                raise AssertionError(f"rank {r} exited with {codes[r]}:\n{logs[r].read()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"ranks still running after {timeout} s (exit codes {codes})")
            if all(c == 0 for c in codes):
                return codes
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
        for log in logs:
            log.close()


def max_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max()) if a.size else 0.0


def numpy_batch_norm(x, eps=1e-5):
    x = np.asarray(x, np.float64)
    mean = x.mean(0)
    var = ((x - mean) ** 2).mean(0)
    return (x - mean) / np.sqrt(var + eps), mean, ((x - mean) ** 2).sum(0) / (len(x) - 1)


# ------------------------------------------------------------ two processes
def test_two_ranks_match_one_process(tmp_path):
    t0 = time.perf_counter()
    run_ranks(tmp_path, "worker")
    ranks = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(SIZE)]
    errors = {}

    # SyncBatchNorm: each rank holds its rows of the single-process result
    for dtype in (mx.float32, mx.float16):
        tol = 1e-5 if dtype == mx.float32 else 2e-2
        for case, ((x_all, ct_all), per_rank) in enumerate(
                zip(bn_rows("all", dtype), zip(*(bn_rows(r, dtype) for r in range(SIZE))))):
            ref = {k: np.array(v.astype(mx.float32)) for k, v in
                   bn_run(nn.BatchNorm(6, momentum=0.3), x_all, ct_all, 1.0).items()}
            xhat, mean, unbiased = numpy_batch_norm(np.array(x_all.astype(mx.float32)))
            np.testing.assert_allclose(ref["y"], xhat, rtol=tol, atol=tol)
            kept = 0.7 ** 3  # three training calls, momentum 0.3
            np.testing.assert_allclose(ref["running_mean"], (1 - kept) * mean, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(ref["running_var"], kept + (1 - kept) * unbiased, rtol=1e-4, atol=1e-4)
            rows = np.cumsum([0] + [len(x) for x, _ in per_rank])
            key = f"bn/{dtype_name(dtype)}/{case}/"
            for name in ("y", "dx", "y_eval"):
                got = np.concatenate([ranks[r][key + name] for r in range(SIZE)])
                np.testing.assert_allclose(got, ref[name], rtol=tol, atol=tol, err_msg=key + name)
                errors[key + name] = max_err(got, ref[name])
            for r in range(SIZE):
                assert len(ranks[r][key + "y"]) == rows[r + 1] - rows[r]
                # statistics are global: every rank holds the same running state
                for name in ("running_mean", "running_var"):
                    np.testing.assert_allclose(ranks[r][key + name], ref[name], rtol=1e-5, atol=1e-5)
                    errors[key + name] = max(errors.get(key + name, 0), max_err(ranks[r][key + name], ref[name]))
            # per-rank parameter gradients sum to the single-process ones
            for name in ("dw", "db"):
                got = sum(ranks[r][key + name] for r in range(SIZE))
                np.testing.assert_allclose(got, ref[name], rtol=tol, atol=tol * 10, err_msg=key + name)
                errors[key + name] = max_err(got, ref[name])

    # a training step: one process, plain BatchNorm, the concatenated global batch
    model = make_model(100)
    global_batch = dist.ShardedSampler(len(SCENES), BATCH * SIZE, rank=0, size=1, shuffle=True, seed=5)
    assert np.array_equal(global_batch.indices()[0],
                          np.concatenate([dist.ShardedSampler(len(SCENES), BATCH, rank=r, size=SIZE,
                                                              seed=5).indices()[0] for r in range(SIZE)]))
    x = ml.sparse_collate([scene(int(k)) for k in global_batch.indices()[0]])
    ref_init = dict(tree_flatten(model.parameters()))
    loss, grads = mnn.value_and_grad(model, lambda m, x: row_losses(m, x).mean())(model, x)
    optim.SGD(learning_rate=LR).update(model, grads)
    ref_grads = dict(tree_flatten(grads))
    ref_params = dict(tree_flatten(model.parameters()))
    for r in range(SIZE):
        for k, v in ref_init.items():  # broadcast_parameters: rank 0's weights everywhere
            np.testing.assert_array_equal(ranks[r][f"init/{k}"], np.array(v))
        np.testing.assert_allclose(ranks[r]["loss"], np.array(loss), rtol=1e-5)
        errors["loss"] = max(errors.get("loss", 0), max_err(ranks[r]["loss"], np.array(loss)))
        for k, v in ref_grads.items():
            np.testing.assert_allclose(ranks[r][f"grad/{k}"], np.array(v), rtol=1e-4, atol=1e-5, err_msg=k)
            errors["grad"] = max(errors.get("grad", 0), max_err(ranks[r][f"grad/{k}"], v))
        for k, v in ref_params.items():
            np.testing.assert_allclose(ranks[r][f"param/{k}"], np.array(v), rtol=1e-4, atol=1e-5, err_msg=k)
            errors["param"] = max(errors.get("param", 0), max_err(ranks[r][f"param/{k}"], v))
    # the ranks stay bitwise in step with each other
    for k in ranks[0]:
        if k.startswith(("grad/", "param/", "loss")):
            np.testing.assert_array_equal(ranks[0][k], ranks[1][k], err_msg=k)
    print(f"\ntwo ranks vs one process ({time.perf_counter() - t0:.1f} s), max abs error:")
    for k, v in errors.items():
        print(f"  {k:40s} {v:.3g}")


def test_failing_rank_fails_fast(tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(AssertionError, match="rank 1 exited"):
        run_ranks(tmp_path, "fail")
    assert time.perf_counter() - t0 < 30


# ------------------------------------------------------------ one process
@pytest.mark.parametrize("n,batch,size,drop_last", [(7, 2, 2, False), (7, 2, 2, True), (8, 2, 2, False),
                                                    (5, 1, 3, False), (3, 2, 2, False), (10, 3, 1, True)])
def test_sampler_shards(n, batch, size, drop_last):
    samplers = [dist.ShardedSampler(n, batch, rank=r, size=size, seed=3, drop_last=drop_last)
                for r in range(size)]
    steps = len(samplers[0])
    g = batch * size
    assert steps == (n // g if drop_last else -(-n // g))
    for epoch in (0, 1):
        per_rank = [s.indices(epoch) for s in samplers]
        assert all(p.shape == (steps, batch) for p in per_rank)
        seen = np.concatenate([np.stack(per_rank, 1).reshape(-1)])
        order = np.random.default_rng([3, epoch]).permutation(n)
        if drop_last:
            np.testing.assert_array_equal(seen, order[:steps * g])
        else:
            np.testing.assert_array_equal(seen[:n], order)  # every item, in the epoch's order
            np.testing.assert_array_equal(seen[n:], np.resize(order, steps * g)[n:])  # padding wraps
        for s, p in zip(samplers, per_rank):
            s.set_epoch(epoch)
            np.testing.assert_array_equal(np.array(list(s)), p)
    assert not np.array_equal(samplers[0].indices(0), samplers[0].indices(1)) or n <= 3
    unshuffled = dist.ShardedSampler(n, batch, rank=0, size=size, shuffle=False, drop_last=drop_last)
    np.testing.assert_array_equal(unshuffled.global_order()[: min(n, steps * g)], np.arange(min(n, steps * g)))


def test_sampler_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_items"):
        dist.ShardedSampler(0, 2, rank=0, size=1)
    with pytest.raises(TypeError, match="batch_size"):
        dist.ShardedSampler(4, 2.0, rank=0, size=1)
    with pytest.raises(ValueError, match="rank"):
        dist.ShardedSampler(4, 2, rank=2, size=2)
    with pytest.raises(ValueError, match="both rank and size"):
        dist.ShardedSampler(4, 2, rank=0)
    with pytest.raises(ValueError, match="drop_last"):
        dist.ShardedSampler(3, 2, rank=0, size=2, drop_last=True)
    s = dist.ShardedSampler(4, 2)  # no backend: the singleton group
    assert (s.rank, s.size, len(s)) == (0, 1, 2)


def test_collate_labelled():
    items = [(scene(k), np.arange(SCENES[k]) + 100 * k) for k in (2, 0)]
    x, y = dist.collate_labelled(items)
    assert x.batch_counts.tolist() == [SCENES[2], SCENES[0]]
    np.testing.assert_array_equal(np.array(y), np.concatenate([np.arange(SCENES[2]) + 200, np.arange(SCENES[0])]))
    with pytest.raises(ValueError, match="item 1"):
        dist.collate_labelled([items[0], (scene(0), np.zeros(3))])
    with pytest.raises(TypeError, match="item 0"):
        dist.collate_labelled([scene(0)[0]])


def test_one_process_helpers_are_plain():
    v = mx.array([1.0, 2.0, 6.0])
    assert float(dist.global_mean(v)) == 3.0
    assert float(dist.global_mean(mx.zeros((0,)))) == 0.0
    g = {"a": mx.array([1.0, -2.0])}
    assert dist.average_gradients(g)["a"].tolist() == [1.0, -2.0]
    assert dist.mean_over_ranks(g)["a"].tolist() == [1.0, -2.0]
    model = make_model(0)
    before = tree_flatten(model.parameters())
    dist.broadcast_parameters(model)
    assert all(np.array_equal(np.array(a), np.array(b)) for (_, a), (_, b) in zip(before, tree_flatten(model.parameters())))
    with pytest.raises(ValueError, match="root"):
        dist.broadcast_parameters(model, root=1)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_sync_batch_norm_single_process_is_batch_norm(dtype):
    for case, (x, ct) in enumerate(bn_rows("all", dtype)):
        ref = bn_run(nn.BatchNorm(6, momentum=0.3), x, ct, 1.0)
        got = bn_run(nn.SyncBatchNorm(6, momentum=0.3), x, ct, 1.0)
        for k in ref:
            np.testing.assert_allclose(np.array(got[k].astype(mx.float32)), np.array(ref[k].astype(mx.float32)),
                                       rtol=1e-5 if dtype == mx.float32 else 2e-3, atol=1e-5, err_msg=k)


def test_sync_batch_norm_edge_cases():
    bn = nn.SyncBatchNorm(2)
    empty = ml.SparseTensor(np.zeros((0, 4), np.int32), mx.zeros((0, 2)))
    assert len(bn(empty)) == 0
    one = ml.SparseTensor(np.zeros((1, 4), np.int32), mx.array([[3.0, -1.0]]))
    assert bn(one).feats.tolist() == [[0.0, 0.0]]
    assert bn.running_mean.tolist() == [0.0, 0.0] and bn.running_var.tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="SyncBatchNorm"):
        bn(mx.zeros((4, 3)))
    frozen = nn.SyncBatchNorm(2, affine=False, track_running_stats=False)
    frozen.eval()  # no running statistics: batch statistics in eval mode too
    y = np.array(frozen(mx.array([[1.0, 2.0], [3.0, 6.0]])))
    np.testing.assert_allclose(y, [[-1, -1], [1, 1]], atol=1e-4)


def test_sync_batch_norm_residual_and_activation():
    rng = np.random.default_rng(3)
    f = mx.array(rng.standard_normal((9, 4)).astype(np.float32) * 2 + 1)
    r = mx.array(rng.standard_normal((9, 4)).astype(np.float32))
    for training in (True, False):
        bn = nn.SyncBatchNorm(4)
        bn.train(training)
        plain = np.array(bn(f))
        got = np.array(bn(f, act=nn.ReLU(), residual=r))
        np.testing.assert_allclose(got, np.maximum(plain + np.array(r), 0), rtol=1e-6, atol=1e-6)


def test_convert_sync_batchnorm_keeps_state():
    from mlx_lattice.models import MinkUNet
    model = MinkUNet(in_channels=3, num_classes=4, width=0.25)
    x = ml.sparse_collate([scene(0), scene(1)])
    model(x)  # move the running statistics off their initial values
    model.eval()
    before = np.array(model(x).feats)
    n_bn = sum(type(m) is nn.BatchNorm for _, m in model.named_modules())
    assert n_bn > 0
    nn.convert_sync_batchnorm(model)
    assert sum(type(m) is nn.BatchNorm for _, m in model.named_modules()) == 0
    assert sum(type(m) is nn.SyncBatchNorm for _, m in model.named_modules()) == n_bn
    assert not any(m.training for _, m in model.named_modules())
    np.testing.assert_array_equal(np.array(model(x).feats), before)
    model.train()
    assert set(dict(tree_flatten(model.trainable_parameters()))) == {
        k for k, _ in tree_flatten(model.parameters()) if "running" not in k}
    single = nn.convert_sync_batchnorm(nn.BatchNorm(3, momentum=0.2))
    assert type(single) is nn.SyncBatchNorm and single.momentum == 0.2


if __name__ == "__main__":
    import faulthandler

    mode, out = sys.argv[1], sys.argv[2]
    # a rank stuck in a collective shows where, before the test's deadline
    faulthandler.dump_traceback_later(float(os.environ.get("RANK_TIMEOUT", "50")), exit=True)
    if mode == "worker":
        worker(out)
    elif mode == "fail":
        failing_worker()
    else:
        raise SystemExit(f"unknown mode {mode}")
