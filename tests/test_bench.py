"""The benchmark's case records (smoke test on a tiny workload)."""

import numpy as np
import pytest

from mlx_lattice import bench, scenes

KEYS = {"workload", "layer", "pass", "c_in", "c_out", "dtype", "n", "edges", "ms", "gflops", "sgemm_fraction", "route"}


def test_bench_cases_have_schema():
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


def test_bench_unet_case():
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
