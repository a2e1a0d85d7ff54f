"""The primitives of a MinkUNet training step's graph on the CPU, pinned.

The host builds the whole graph of a step before the backend runs it, and on
a fast device that building is the step's bound: every primitive costs host
time. A MinkUNet 0.5x step with its maps cached is 575 primitives on the CPU
(docs/benchmarks.md): the products and norms themselves (a primitive each
way), MLX's own (its tracer copies of the model's arrays, the loss), the
shared tensors' forks and sums, and Adam's updates, sixteen parameters to a
primitive.
These tests keep it from growing back unnoticed, and name the glue that
must stay out (a copy, transpose or custom function per product, zero
cotangents, a running-statistics update per norm).
"""

from collections import Counter

import numpy as np
import pytest
import mlx.core as mx

from mlx_lattice.bench import profile
from mlx_lattice.bench.training_step import TrainingStep

from conftest import voxel_cloud

# The step's primitives at most: the count of docs/benchmarks.md's 0.5x
# step (the same graph at any width and scene size, as long as every layer
# has rows).
MAX_PRIMITIVES = 575

# Per kind: 50 convolutions (forward + input gradient, none for the input
# layer's features) and their weight gradients, 49 batch norms, and 149
# parameters' updates in groups of optimizers.CPU_GROUP.
EXACT = {"SparseGatherConv": 99, "SparseWeightGrad": 50, "SparseNormAct": 49, "SparseNormActGrad": 49,
         "AdamUpdate": 10}
ABSENT = ("Contiguous", "StopGradient", "CustomTransforms", "Transpose", "Reshape", "Full",
          "SparseRunningStats")


@pytest.fixture(scope="module")
def step_graph():
    """(graph of a step with its maps cached, the step) on the CPU."""
    previous = mx.default_device()
    mx.set_default_device(mx.cpu)
    try:
        coords = np.array(voxel_cloud(np.random.default_rng(7), 4000, batches=2, extent=16))
        step = TrainingStep(coords, width=0.25)
        step()
        x = step.tensor()
        mx.eval(step.loss_grad(step.model, x), step.model.state)
        loss, grads = step.loss_grad(step.model, x)
        step.update(grads)
        nodes = profile.graph_nodes(loss, step.model.parameters(), step.optimizer.state)
        mx.eval(loss, step.model.state, step.optimizer.state)
        yield nodes, step
    finally:
        mx.set_default_device(previous)


def test_step_graph_is_small(step_graph):
    nodes, _ = step_graph
    assert sum(nodes.values()) <= MAX_PRIMITIVES, nodes.most_common()
    for kind, n in EXACT.items():
        assert nodes[kind] == n, (kind, nodes.most_common())
    assert not [k for k in ABSENT if k in nodes], nodes.most_common()


def test_mlx_copies_only_the_traced_arrays(step_graph):
    """The Copy nodes are MLX's tracer copies (one per array of the model
    passed to value_and_grad: parameters and running statistics), none of
    the library's."""
    nodes, step = step_graph
    from mlx.utils import tree_flatten

    arrays = len(tree_flatten(step.model.parameters()))
    assert nodes["Copy"] <= arrays


def test_profile_reports_primitives_host_and_eval_times(rng, on_cpu):
    """``bench --profile`` on the CPU: both phases with host and evaluation
    times and the primitives by kind, as text and as JSON-ready values."""
    step = TrainingStep(np.array(voxel_cloud(rng, 1500)), width=0.25)
    p = profile.profile(step, repeats=1)
    assert p["backend"] == "cpu" and p["step_cached_s"] > 0 and p["adam_s"] > 0
    host, ev, acc, calls, syncs, nodes = p["phases"]["maps cached"]
    assert host > 0 and ev > 0 and syncs == {} and isinstance(nodes, Counter)
    assert sum(nodes.values()) <= MAX_PRIMITIVES and nodes["AdamUpdate"] == EXACT["AdamUpdate"]
    built = p["phases"]["maps built"][5]
    assert built["SparseGatherConv"] == nodes["SparseGatherConv"]  # no earlier pass left in the graph
    text = profile.format_profile(p)
    assert f"{sum(nodes.values())} primitives in the step's graph" in text and "SparseGatherConv 99" in text
    js = profile.phases_json(p["phases"])
    assert js["maps cached"]["primitives"]["SparseNormAct"] == 49
