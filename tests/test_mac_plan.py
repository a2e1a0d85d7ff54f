"""The Mac plan (mlx_lattice/mac_plan.py): a recorded run's calls put to the
registry as a Mac of a given tier would see them."""

import json

import mlx.core as mx
import numpy as np
import pytest

import mlx_lattice as ml
from mlx_lattice import __main__ as cli
from mlx_lattice import mac_plan, ops, routes


def _record_run(tmp_path):
    rng = np.random.default_rng(0)
    xyz = np.unique(rng.integers(0, 12, (400, 3)), axis=0)
    coords = np.concatenate([np.zeros((len(xyz), 1), np.int32), xyz], axis=1).astype(np.int32)
    x = ml.SparseTensor(coords, mx.array(rng.standard_normal((len(coords), 24)).astype(np.float32)))
    w3 = mx.array(rng.standard_normal((40, 3, 3, 3, 24)).astype(np.float32))
    w1 = mx.array(rng.standard_normal((8, 1, 1, 1, 40)).astype(np.float32))

    def loss(w3, w1):
        return ops.conv3d(ops.subm_conv3d(x, w3), w1).feats.sum()

    with ml.diagnostics.record() as log:
        mx.eval(mx.grad(loss, argnums=(0, 1))(w3, w1))
    path = tmp_path / "run.json"
    log.dump(path)
    return path, log


def test_plan_selects_as_the_registry_would_on_a_mac(tmp_path):
    path, log = _record_run(tmp_path)
    records = mac_plan.load(path)
    assert len(records) == len(log) and {r["direction"] for r in records} == {"forward", "dgrad", "wgrad"}
    p = mac_plan.plan(records, "m4", "bfloat16")
    # every call's route is the registry's own answer for the Mac's context
    expect: dict[str, int] = {}
    for r in records:
        name = routes.select(mac_plan.mac_context(r, "m4", "bfloat16")).route.name
        expect[name] = expect.get(name, 0) + 1
    assert {k: v["calls"] for k, v in p["routes"].items()} == expect
    # multiply-adds: edges x C_in x C_out, summed, split by kind of kernel
    total = sum(mac_plan.multiply_adds(r) for r in records)
    assert p["multiply_adds"] == total
    assert abs(sum(p["share"].values()) - 1) < 1e-12
    kinds = {k: 0 for k in ("matrix", "scalar", "cpu")}
    for r in records:
        route = routes.select(mac_plan.mac_context(r, "m4", "bfloat16")).route
        kind = "cpu" if route.backend != "metal" else "matrix" if route.matrix_unit else "scalar"
        kinds[kind] += mac_plan.multiply_adds(r)
    assert p["share"] == {k: v / total for k, v in kinds.items()}
    assert p["share"]["cpu"] == 0  # bfloat16 stays on the GPU
    assert routes.get("metal.csr_mma").matrix_unit and not routes.get("metal.vec4").matrix_unit


def test_cli_and_route_log_lines(tmp_path, capsys):
    path, log = _record_run(tmp_path)
    lines = tmp_path / "run.jsonl"
    lines.write_text("\n".join(json.dumps(r) for r in log) + "\n")
    assert mac_plan.load(lines) == mac_plan.load(path)
    assert cli.main(["routes", "--mac", "m5", "--log", str(lines), "--dtype", "float16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Mac tier m5 (applegpu_g17s, 26.2), features float16:")
    assert "matrix units" in out and "metal." in out


def test_every_routes_variant_prints_json_with_json(tmp_path, capsys):
    path, log = _record_run(tmp_path)
    lines = tmp_path / "run.jsonl"
    lines.write_text("\n".join(json.dumps(r) for r in log) + "\n")
    # the registry
    assert cli.main(["routes", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in listed] == [r["name"] for r in routes.list_routes()]
    # the Mac plan, for every tier, dtype and kind of log: the same numbers
    # as mac_plan.plan, as JSON
    for tier in mac_plan.TIERS:
        for dtype in (None, "float32", "float16", "bfloat16"):
            for log_path in (path, lines):
                argv = ["routes", "--mac", tier, "--log", str(log_path), "--json"]
                argv += ["--dtype", dtype] if dtype else []
                assert cli.main(argv) == 0
                got = json.loads(capsys.readouterr().out)
                assert got == json.loads(json.dumps(mac_plan.plan(mac_plan.load(path), tier, dtype)))
                assert got["tier"] == tier and got["dtype"] == dtype and got["calls"] == len(log)
    # without --json: the text as before
    assert cli.main(["routes", "--mac", "m4", "--log", str(path)]) == 0
    assert capsys.readouterr().out.startswith("Mac tier m4")
    # combinations that mean nothing are refused, not half-answered
    for argv in (["--mac", "m4"], ["--log", str(path)], ["--mac", "m4", "--log", str(path), "--markdown"],
                 ["--dtype", "float16"], ["--json", "--markdown"]):
        with pytest.raises(SystemExit):
            cli.main(["routes", *argv])
        assert "routes" in capsys.readouterr().err


def test_neighbour_queries_in_the_plan(tmp_path, capsys):
    """A run's neighbour queries, planned as a Mac would route them: the
    Metal routes within their predicates, the CPU's past them (a point
    batch index past the grid's), and no multiply-adds."""
    path, log = _record_run(tmp_path)
    p = np.random.default_rng(1).standard_normal((30, 3)).astype(np.float32)
    far_items = np.zeros(30, np.int32)
    far_items[0] = 1 << 20
    with ml.diagnostics.record() as queries:
        ml.neighbors.knn(p, p, 4)
        ml.neighbors.radius(p, p, 0.5)
        ml.neighbors.knn(p, p, 4, query_batch=far_items, point_batch=far_items)
    lines = tmp_path / "run.jsonl"
    lines.write_text("\n".join(json.dumps(r) for r in [*log, *queries]) + "\n")
    records = mac_plan.load(lines)
    assert len(records) == len(log) + 3
    p5 = mac_plan.plan(records, "m5", "float16")
    assert p5["calls"] == len(log) and p5["multiply_adds"] == mac_plan.plan(mac_plan.load(path), "m5", "float16")[
        "multiply_adds"]
    assert p5["queries"] == {"metal.knn": {"calls": 1, "kind": "gpu"}, "metal.radius": {"calls": 1, "kind": "gpu"},
                             "cpu.knn": {"calls": 1, "kind": "cpu"}}
    assert p5["fallbacks"]["no metal route accepts this call; running on the CPU"] >= 1
    assert cli.main(["routes", "--mac", "m4", "--log", str(lines)]) == 0
    out = capsys.readouterr().out
    assert "neighbour queries" in out and "metal.knn" in out and "metal.radius" in out
    # a hand-written query record needs only its op, sizes and k
    assert mac_plan.record_problem({"op": "knn", "n_in": 5, "n_out": 2, "k": 3}) is None
    assert routes.select(mac_plan.mac_context({"op": "knn", "n_in": 5, "n_out": 2, "k": 3}, "m3")).route.name == (
        "metal.knn")
    assert mac_plan.record_problem({"op": "radius", "n_in": 5, "n_out": 2}) == "missing k"
    assert mac_plan.record_problem({"op": "radius", "n_in": 5, "n_out": 2, "k": 0, "radius": -1.0}) == (
        "radius is -1.0, not a number >= 0")
    assert mac_plan.record_problem({"op": "knn", "n_in": 5, "n_out": 2, "k": 1, "direction": "forward"}) == (
        "direction is 'forward', not the query's 'knn'")
