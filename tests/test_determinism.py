"""Bitwise-identical results across repeated runs and thread counts."""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import ops

import oracle


@pytest.fixture
def restore_threads():
    n = ml.num_threads()
    yield
    ml.set_num_threads(n)


def run_all(coords, feats, w_sub, w_down):
    x = ml.SparseTensor(coords, feats)

    def f(feats, w_sub, w_down):
        t = x.replace(feats)
        a = ops.subm_conv3d(t, w_sub)
        b = ops.conv3d(a, w_down, stride=2)
        return (b.feats**2).sum(), (a, b)

    (loss, (a, b)), grads = mx.value_and_grad(f, argnums=(0, 1, 2))(feats, w_sub, w_down)
    out = [a.feats, b.feats, *grads]
    mx.eval(out)
    return [np.array(o) for o in out] + [np.array(b.coords)]


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_bitwise_across_threads_and_runs(rng, restore_threads, dtype, on_cpu):
    coords = oracle.random_coords(rng, 6000, 30, 2)
    feats = mx.array(rng.standard_normal((len(coords), 16)).astype(np.float32)).astype(dtype)
    w_sub = mx.array(rng.standard_normal((16, 3, 3, 3, 16)).astype(np.float32) / 10).astype(dtype)
    w_down = mx.array(rng.standard_normal((32, 2, 2, 2, 16)).astype(np.float32) / 10).astype(dtype)
    ml.set_num_threads(1)
    ref = run_all(coords, feats, w_sub, w_down)
    for n in (2, 3, 8):
        ml.set_num_threads(n)
        for _ in range(2):
            got = run_all(coords, feats, w_sub, w_down)
            for r, g in zip(ref, got):
                assert r.tobytes() == g.tobytes()


def test_thread_count_validation():
    with pytest.raises(ValueError, match="positive int"):
        ml.set_num_threads(0)
