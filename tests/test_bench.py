"""The benchmark's case records (smoke test on a tiny workload)."""

import numpy as np
import pytest

from mlx_lattice import bench, scenes
from mlx_lattice.nn import normalization

KEYS = {"workload", "layer", "pass", "c_in", "c_out", "dtype", "n", "edges", "ms", "gflops", "sgemm_fraction", "route"}


def test_best_time_warms_up_for_the_given_time():
    calls = []
    t = bench.best_time(lambda: calls.append(1), 3, warmup_s=0.02)
    # one warm-up call, more until 20 ms have passed, then the 3 timed ones
    assert len(calls) > 4 and t >= 0.0
    calls.clear()
    bench.best_time(lambda: calls.append(1), 3)
    assert len(calls) == 4


def test_best_time_times_calls_for_the_given_time():
    calls = []
    bench.best_time(lambda: calls.append(1), 3, min_time_s=0.02)
    # a call takes microseconds: far more than 3 are timed in 20 ms
    assert len(calls) > 10
    calls.clear()
    bench.best_time(lambda: calls.append(1), 3, min_time_s=10.0, max_calls=7)
    assert len(calls) == 1 + 7


def test_bench_cases_have_schema(monkeypatch):
    monkeypatch.setattr(bench, "LAYER_WARMUP_S", 0.0)
    monkeypatch.setattr(bench, "LAYER_MIN_TIME_S", 0.0)
    coords = scenes.uniform_random(3000, 24)
    cases = []
    for layer in bench.layers(quick=True):
        bench.run_layer("random", coords, layer, "float32", 100.0, 1, baseline=True, emit=cases.append)
    passes = {c["pass"] for c in cases}
    assert {"forward", "dgrad", "wgrad", "map"} <= passes
    for c in cases:
        assert KEYS <= set(c), set(c) ^ KEYS
        assert c["ms"] > 0
        if c["pass"] != "map":
            assert c["speedup_vs_baseline"] > 0 and c["gflops"] > 0
        assert bench.format_row(c)
    assert bench.format_header()


def test_bench_unet_case(monkeypatch):
    monkeypatch.setattr(bench, "NETWORK_MIN_TIME_S", 0.0)
    coords = scenes.uniform_random(1500, 20)
    cases = []
    bench.run_unet("random", coords, "float32", 100.0, 1, cases.append, width=0.25)
    case = cases[0]
    assert case["pass"] == "train step" and case["route"] == "network" and case["ms"] > 0
    # useful FLOPs: every convolution's forward, weight gradient and (past
    # the input layer) input gradient, 2 * edges * C_in * C_out each
    assert case["useful_gflop"] > 0
    assert case["gflops"] == pytest.approx(case["useful_gflop"] / case["ms"] * 1e3)
    assert case["sgemm_fraction"] == pytest.approx(case["gflops"] / 100.0)
    assert bench.format_row(case)


def test_useful_flops_match_the_recorded_products(on_cpu):
    """The route-record count (any backend) equals the count over the CPU
    primitive's own recorded products."""
    from mlx_lattice import network_bench

    step = network_bench.TrainingStep(scenes.uniform_random(1500, 20), width=0.25)
    with network_bench._recording() as rec:
        step.model(step.tensor())
    by_products = sum(network_bench.conv_flops(rec, step.feats))
    assert by_products > 0
    assert network_bench.useful_flops(step) == pytest.approx(by_products, rel=1e-12)


def test_network_profile_stages(on_cpu, monkeypatch):  # the stage profile replays CPU primitives
    from mlx_lattice import network_bench

    monkeypatch.setattr(bench, "NETWORK_MIN_TIME_S", 0.0)
    coords = scenes.uniform_random(1500, 20)
    for fused in (True, False):
        with normalization.fused_norms(fused):
            step = network_bench.TrainingStep(coords, width=0.25)
            prof = network_bench.profile(step, repeats=1)
        stages = prof["stages"]
        assert prof["total"] > 0 and all(v >= 0 for v in stages.values())
        assert stages["conv forward"] > 0 and stages["conv weight gradient"] > 0
        assert ("norm + act + add (fused) forward" in stages) == fused
        assert ("activation forward" in stages) != fused
        f, d, w = prof["flops"]
        assert f == w and 0 < d < f  # no input gradient for the input layer
        assert sum(prof["flops"]) == network_bench.useful_flops(step)
        assert "| conv forward |" in network_bench.format_profile(prof, 100.0, "t")


def test_network_layer_rows(on_cpu):
    """Every product of the step is in one row: their FLOPs add up to the
    step's useful FLOPs, and only the input layer has no input gradient."""
    from mlx_lattice import network_bench

    coords = scenes.uniform_random(1500, 20)
    sgemm, rows = bench.network_layer_rows(coords, width=0.25, repeats=1)
    assert sgemm > 0
    step = network_bench.TrainingStep(coords, width=0.25)
    flops = sum(r["flop"] * r["layers"] * (2 if r["seconds"][1] is None else 3) for r in rows)
    assert flops == pytest.approx(network_bench.useful_flops(step), rel=1e-12)
    assert sum(r["seconds"][1] is None for r in rows) == 1
    assert all(t is None or t > 0 for r in rows for t in r["seconds"])
