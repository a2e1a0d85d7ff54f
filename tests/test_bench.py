"""The benchmark's case records (smoke test on a tiny workload)."""

import pytest

from mlx_lattice import scenes
from mlx_lattice.bench import layers, network, timing, training_step
from mlx_lattice.nn import normalization

KEYS = {"workload", "layer", "pass", "c_in", "c_out", "dtype", "n", "edges", "ms", "gflops", "sgemm_fraction", "route"}


def test_best_time_warms_up_for_the_given_time():
    calls = []
    t = timing.best_time(lambda: calls.append(1), 3, warmup_s=0.02)
    # one warm-up call, more until 20 ms have passed, then the 3 timed ones
    assert len(calls) > 4 and t >= 0.0
    calls.clear()
    timing.best_time(lambda: calls.append(1), 3)
    assert len(calls) == 4


def test_best_time_times_calls_for_the_given_time():
    calls = []
    timing.best_time(lambda: calls.append(1), 3, min_time_s=0.02)
    # a call takes microseconds: far more than 3 are timed in 20 ms
    assert len(calls) > 10
    calls.clear()
    timing.best_time(lambda: calls.append(1), 3, min_time_s=10.0, max_calls=7)
    assert len(calls) == 1 + 7


def test_bench_cases_have_schema(monkeypatch):
    from mlx_lattice.bench.workloads import layers as layer_shapes

    monkeypatch.setattr(timing, "LAYER_WARMUP_S", 0.0)
    monkeypatch.setattr(timing, "LAYER_MIN_TIME_S", 0.0)
    coords = scenes.uniform_random(3000, 24)
    cases = []
    for layer in layer_shapes(quick=True):
        layers.run_layer("random", coords, layer, "float32", 100.0, 1, baseline=True, emit=cases.append)
    passes = {c["pass"] for c in cases}
    assert {"forward", "dgrad", "wgrad", "map"} <= passes
    for c in cases:
        assert KEYS <= set(c), set(c) ^ KEYS
        assert c["ms"] > 0
        if c["pass"] != "map":
            assert c["speedup_vs_baseline"] > 0 and c["gflops"] > 0
        assert layers.format_row(c)
    assert layers.format_header()


def test_bench_unet_case(monkeypatch):
    monkeypatch.setattr(timing, "NETWORK_MIN_TIME_S", 0.0)
    coords = scenes.uniform_random(1500, 20)
    cases = []
    layers.run_unet("random", coords, "float32", 100.0, 1, cases.append, width=0.25)
    case = cases[0]
    assert case["pass"] == "train step" and case["route"] == "network" and case["ms"] > 0
    # useful FLOPs: every convolution's forward, weight gradient and (past
    # the input layer) input gradient, 2 * edges * C_in * C_out each
    assert case["useful_gflop"] > 0
    assert case["gflops"] == pytest.approx(case["useful_gflop"] / case["ms"] * 1e3)
    assert case["sgemm_fraction"] == pytest.approx(case["gflops"] / 100.0)
    assert layers.format_row(case)


def test_useful_flops_match_the_recorded_products(on_cpu):
    """The route-record count (any backend) equals the count over the CPU
    primitive's own recorded products."""
    step = training_step.TrainingStep(scenes.uniform_random(1500, 20), width=0.25)
    with network._recording() as rec:
        step.model(step.tensor())
    by_products = sum(network.conv_flops(rec, step.feats))
    assert by_products > 0
    assert training_step.useful_flops(step) == pytest.approx(by_products, rel=1e-12)


def test_network_profile_stages(on_cpu, monkeypatch):  # the stage profile replays CPU primitives
    monkeypatch.setattr(timing, "NETWORK_MIN_TIME_S", 0.0)
    coords = scenes.uniform_random(1500, 20)
    for fused in (True, False):
        with normalization.fused_norms(fused):
            step = training_step.TrainingStep(coords, width=0.25)
            prof = network.profile(step, repeats=1)
        stages = prof["stages"]
        assert prof["total"] > 0 and all(v >= 0 for v in stages.values())
        assert stages["conv forward"] > 0 and stages["conv weight gradient"] > 0
        assert ("norm + act + add (fused) forward" in stages) == fused
        assert ("activation forward" in stages) != fused
        f, d, w = prof["flops"]
        assert f == w and 0 < d < f  # no input gradient for the input layer
        assert sum(prof["flops"]) == training_step.useful_flops(step)
        assert "| conv forward |" in network.format_profile(prof, 100.0, "t")


def test_network_layer_rows(on_cpu):
    """Every product of the step is in one row: their FLOPs add up to the
    step's useful FLOPs, and only the input layer has no input gradient."""
    coords = scenes.uniform_random(1500, 20)
    sgemm, rows = network.network_layer_rows(coords, width=0.25, repeats=1)
    assert sgemm > 0
    step = training_step.TrainingStep(coords, width=0.25)
    flops = sum(r["flop"] * r["layers"] * (2 if r["seconds"][1] is None else 3) for r in rows)
    assert flops == pytest.approx(training_step.useful_flops(step), rel=1e-12)
    assert sum(r["seconds"][1] is None for r in rows) == 1
    assert all(t is None or t > 0 for r in rows for t in r["seconds"])


def test_the_library_never_imports_the_bench():
    """Every library module imports without mlx_lattice.bench (only the
    command line, mlx_lattice/__main__.py, reaches it)."""
    import subprocess
    import sys

    code = (
        "import importlib, pkgutil, sys, mlx_lattice\n"
        "def walk(pkg):\n"
        "    for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + '.'):\n"
        "        if m.name == 'mlx_lattice.bench' or m.name.endswith('__main__'):\n"
        "            continue\n"
        "        mod = importlib.import_module(m.name)\n"
        "        if m.ispkg:\n"
        "            walk(mod)\n"
        "walk(mlx_lattice)\n"
        "print(sorted(m for m in sys.modules if m.startswith('mlx_lattice.bench')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_bench_modules_import_each_other_without_circles():
    """The package's file-level import graph (lazy imports included) is a DAG."""
    import ast
    from pathlib import Path

    import mlx_lattice.bench as pkg

    root = Path(pkg.__file__).parent
    graph = {}
    for path in root.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module} if node.module else {a.name for a in node.names}
        graph[path.stem] = {d.split(".")[0] for d in deps if (root / f"{d.split('.')[0]}.py").exists()}
    done, visiting = set(), []

    def visit(m):
        assert m not in visiting, f"import circle: {' -> '.join(visiting[visiting.index(m):] + [m])}"
        if m in done:
            return
        visiting.append(m)
        for d in graph[m]:
            visit(d)
        visiting.pop()
        done.add(m)

    for m in graph:
        visit(m)
    assert "timing" in graph and not graph["timing"]
