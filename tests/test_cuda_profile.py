"""The GPU step profile (mlx_lattice/bench/cuda_profile.py): its counters on
any device, and a whole profile of a small MinkUNet step on CUDA, whose map
building must cost one host synchronisation per map."""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import ops
from mlx_lattice.bench import cuda_profile

from conftest import needs_cuda, voxel_cloud


def test_graph_nodes_counts_primitives():
    a = mx.ones((3,))
    mx.eval(a)
    nodes = cuda_profile.graph_nodes((a * 2 + 1).sum())
    assert nodes["Multiply"] == 1 and nodes["Add"] == 1 and nodes["Sum"] == 1
    assert sum(cuda_profile.graph_nodes(a).values()) == 0  # evaluated: no graph


def test_host_timers_count_layers_and_evaluations(rng):
    coords = voxel_cloud(rng, 200)
    x = ml.SparseTensor(coords, mx.array(rng.standard_normal((coords.shape[0], 8)).astype(np.float32)))
    w = mx.array(rng.standard_normal((8, 3, 3, 3, 8)).astype(np.float32))
    original = mx.eval
    with cuda_profile.host_timers() as (acc, calls):
        y = ops.subm_conv3d(x, w)
        mx.eval(y.feats)
    assert calls["conv submanifold k3 s1"] == 1 and calls["mx.eval"] == 1
    assert acc["conv submanifold k3 s1"] > 0
    assert mx.eval is original and ops._execute.__name__ == "_execute"  # restored


@pytest.mark.slow
@needs_cuda
def test_profile_of_a_step_on_cuda(rng, on_gpu):
    from mlx_lattice.bench.training_step import TrainingStep

    coords = np.array(voxel_cloud(rng, 3000, batches=2, extent=24))
    p = cuda_profile.profile(TrainingStep(coords, width=0.25, dtype=mx.float16), repeats=1)
    built, cached = p["phases"]["maps built"], p["phases"]["maps cached"]
    # The user's set, four output supports, five submanifold relations; the
    # four strided (k2s2) relations have an edge per input row, known without
    # a read, and the decoder's relations are the encoder's, swapped.
    assert built[4] == {"table flags": 1, "support size": 4, "relation size": 5}
    assert built[0] > 0 and built[1] > 0 and built[2]  # host, eval, categories
    assert cached[4] == {}
    assert p["products"] and all(q.forward_s > 0 and q.dgrad_s > 0 and q.wgrad_s > 0 for q in p["products"])
    assert all(r.startswith("cuda.") for q in p["products"] for r in q.routes)
    assert p["adam_compiled_s"] > 0 and p["eval_floor_s"] > 0
    assert all(t > 0 for t in p["map_stages_s"].values())


def test_conv_calls_replay_what_the_ops_pass_to_cuda(rng, monkeypatch):
    """The products recorded for the replay carry every argument the ops
    gave the CUDA route (its tile variant too); simulated on any device."""
    from types import SimpleNamespace

    from mlx_lattice import backends
    from mlx_lattice.backends import cuda

    coords = voxel_cloud(rng, 200)
    x = ml.SparseTensor(coords, mx.ones((coords.shape[0], 8), mx.float16))
    w = mx.ones((8, 3, 3, 3, 8), mx.float16)
    calls = []

    class FakeView:  # what autodiff reads of a CUDA view
        def __init__(self, rel, flipped=None):
            self.rel, self.kind, self.edges, self.symmetric = rel, rel.kind, rel.edges, False
            self.is_flipped = flipped is not None
            self.rows = rel.n_in if self.is_flipped else rel.n_out
            self._flipped = flipped

        def flipped(self):
            self._flipped = self._flipped or FakeView(self.rel, self)
            return self._flipped

    def launch(route, op, a, b, view, k=1, groups=1, variant=None, flip=(False, False)):
        calls.append((route, a, b, view, groups, variant, op))
        if op == "weight_grad":
            return mx.zeros((k, a.shape[1], b.shape[1]), a.dtype)
        return mx.zeros((view.rows, b.shape[1] if flip[0] else b.shape[2]), a.dtype)

    monkeypatch.setattr(backends, "current", lambda stream=None: cuda.BACKEND)
    monkeypatch.setattr(cuda.BACKEND, "product_view", lambda rel: FakeView(rel))
    monkeypatch.setattr(cuda.BACKEND, "launch", launch)
    step = SimpleNamespace(model=lambda t: ops.subm_conv3d(t, w))
    rec = cuda_profile._conv_calls(step, x)
    assert len(rec) == len(calls) == 1
    (route, f, wm, view, groups, variant), call = rec[0], calls[0]
    assert f is x.feats and (route, view, groups, variant) == (call[0], call[3], call[4], call[5])
    # autodiff hands the kernels the same arrays, cut from the graph
    assert mx.array_equal(call[1], f) and mx.array_equal(call[2], wm)
    (times,) = cuda_profile.conv_device_times(step, x, repeats=1)
    # one convolution, its three products timed, each with the route that ran it
    assert (times.layer, times.c_in, times.c_out, times.rows) == ("submanifold k3 s1", 8, 8, coords.shape[0])
    assert times.edges == view.rel.edges and min(times.forward_s, times.dgrad_s, times.wgrad_s) > 0
    assert times.routes[0] == route and times.routes[1] in cuda.ROUTES and times.routes[2] in cuda.ROUTES
    assert cuda.ROUTES[times.routes[2]].op == "weight_grad"
    # the slowest first, at most `top` of them (which are slowest is the
    # timing's: all three are listed here)
    lines = cuda_profile.format_products([times], top=3)
    assert "weight gradients" in lines[0] and len(lines) == 4 and times.routes[2] in "".join(lines)
    secs = [float(line.split()[-2]) for line in lines[1:]]
    assert secs == sorted(secs, reverse=True)
    assert len(cuda_profile.format_products([times], top=2)) == 3
    # the replay's products: forward on the recorded route and variant, and
    # the backward products on the flipped view (input gradient) and the view
    forward = [c for c in calls[1:] if c[6] == "conv" and not c[3].is_flipped]
    assert forward and all(c[0] == calls[0][0] and c[5] == calls[0][5] for c in forward)
    assert any(c[6] == "conv" and c[3].is_flipped for c in calls)
    assert any(c[6] == "weight_grad" for c in calls)



def test_memory_breakdown_of_a_step(rng):
    """The profile's memory lines on any device: the maps' arrays counted
    once each, and peaks that contain what stays allocated."""
    from mlx_lattice.bench.training_step import TrainingStep

    step = TrainingStep(np.array(voxel_cloud(rng, 1500)))
    m = cuda_profile.memory(step)
    assert m["map_arrays"] > 10 and m["map_bytes"] > 0
    for k in ("maps_peak_bytes", "forward_peak_bytes", "forward_backward_peak_bytes", "step_peak_bytes"):
        assert m[k] >= m["held_bytes"] > 0, k
    assert m["forward_backward_peak_bytes"] >= m["forward_peak_bytes"] * 0.5
    assert "the sample's maps keep" in cuda_profile.format_memory(m)
    x = step.tensor()
    step.model(x)
    arrays = cuda_profile.map_arrays(x.manager)
    assert len({id(a) for a in arrays}) == len(arrays)
