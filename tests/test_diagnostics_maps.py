"""Map routes on record: every coordinate table, support and relation the
CoordinateManager builds writes a diagnostics record (op "map") with its
route, kind, sizes and host synchronisations. The Metal path's records are
checked through the harness in tests/metal/test_metal_map_path.py."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

import mlx_lattice as ml
from mlx_lattice import diagnostics, manager, ops

import oracle


def _network(rng):
    coords = mx.array(oracle.random_coords(rng, 200, 8, batches=2))
    x = ml.SparseTensor(coords, mx.array(rng.standard_normal((coords.shape[0], 4)).astype(np.float32)))
    y = ops.subm_conv3d(x, mx.ones((4, 3, 3, 3, 4)))
    d = ops.conv3d(y, mx.ones((8, 2, 2, 2, 4)), stride=2)
    u = ops.conv_transpose3d(d, mx.ones((4, 2, 2, 2, 8)), stride=2)  # the strided layer's edges swapped
    g = ops.generative_conv_transpose3d(u, mx.ones((2, 2, 2, 2, 4)), stride=2)
    mx.eval(g.feats)
    return x, y, d, u, g


def test_cpu_map_records(rng):
    route = manager.map_route()
    if route != "cpu.hash_map":
        pytest.skip(f"maps are built by {route} here")
    with diagnostics.record(maps=True) as log:
        x, y, d, u, g = _network(rng)
    maps = [r for r in log if r["op"] == "map"]
    convs = [r for r in log if r["op"] != "map"]
    assert len(convs) == 4 and all(r["route"].startswith("cpu.") for r in convs)
    got = [(r["product"], r["map_kind"], r["swapped"]) for r in maps]
    assert got == [
        ("table", None, False),  # x's coordinates
        ("relation", "submanifold", False),
        ("support", "forward", False), ("table", None, False), ("relation", "forward", False),
        ("relation", "transposed", True),
        ("support", "generative", False), ("table", None, False), ("relation", "generative", False),
    ]
    for r in maps:
        assert r["route"] == "cpu.hash_map" and r["backend"] == "cpu" and r["syncs"] == 0
    n, m, q = len(x), len(d), len(g)
    table, sub, sup, _, fwd, tr, gsup, _, gen = maps
    assert (table["n_in"], table["n_out"], table["k"], table["edges"]) == (n, n, 1, 0)
    rel = x.manager.submanifold_kernel_relation(x.coordinate_set, ml.KernelGeometry((3, 3, 3), padding=(1, 1, 1)))
    assert (sub["n_in"], sub["n_out"], sub["k"]) == (n, n, 27) and sub["edges"] > n
    assert sub["kernel_size"] == (3, 3, 3) and sub["stride"] == (1, 1, 1)
    assert (sup["n_in"], sup["n_out"], sup["k"], sup["stride"]) == (n, m, 8, (2, 2, 2))
    assert (fwd["n_in"], fwd["n_out"], fwd["edges"]) == (n, m, n)  # stride 2, kernel 2: one edge per input
    assert (tr["n_in"], tr["n_out"], tr["edges"]) == (m, n, n)
    assert (gsup["n_in"], gsup["n_out"]) == (n, q) and (gen["n_in"], gen["n_out"], gen["edges"]) == (n, q, 8 * n)
    assert rel.edges == sub["edges"]
    # recorded once: a second network on the same coordinates reuses the maps
    with diagnostics.record(maps=True) as again:
        y2 = ops.subm_conv3d(x, mx.ones((4, 3, 3, 3, 4)))
    assert [r["op"] for r in again] == ["subm_conv3d"] and y2.coords is x.coords


def test_conv_logs_leave_map_records_out(rng, monkeypatch, tmp_path):
    """record() collects convolution records only (what existing consumers
    count); the JSON-lines log takes both kinds."""
    path = tmp_path / "routes.jsonl"
    monkeypatch.setenv("MLX_LATTICE_ROUTE_LOG", str(path))
    with diagnostics.record() as convs, diagnostics.record(maps=True) as both:
        _network(rng)
    assert [r["op"] for r in convs] == ["subm_conv3d", "conv3d", "conv_transpose3d", "generative_conv_transpose3d"]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == json.loads(json.dumps(list(both)))
    assert len(both) == len(convs) + 9 and sum(r["op"] == "map" for r in lines) == 9
    table = both.table()
    assert "relation submanifold" in table and "support generative" in table and "table" in table
    assert len(table.splitlines()) == 2 + len(both)


def test_map_record_fields():
    entry = diagnostics.map_record(
        "relation", "metal.hash_map", map_kind="forward", n_in=10, n_out=4, k=8, edges=10, syncs=1,
        geometry=((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1)))
    assert entry["backend"] == "metal" and entry["op"] == "map" and entry["syncs"] == 1
    assert entry["kernel_size"] == (2, 2, 2) and entry["swapped"] is False
    with pytest.raises(ValueError, match="product must be one of"):
        diagnostics.map_record("plan", "cpu.hash_map", map_kind=None, n_in=0, n_out=0, k=1, edges=0, syncs=0)
