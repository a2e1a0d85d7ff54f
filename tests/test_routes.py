"""Route registry, selection as a pure function of context, and diagnostics."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import _ext, ops, routes
from mlx_lattice.backends import metal_routes
from mlx_lattice.routes import RouteContext

import oracle

ROOT = Path(__file__).resolve().parents[1]


def ctx(**kw):
    base = dict(op="conv3d", map_kind="forward", dtype="float32", backend="cpu", kernel_size=(3, 3, 3))
    base.update(kw)
    return RouteContext(**base)


def test_context_fields_derived_and_immutable():
    # Built directly or through routes.context (dispatch's fast path): the
    # kernel volume is derived from the kernel size unless given, and the two
    # are the same key.
    direct = ctx(kernel_size=(3, 1, 2), c_in=16, c_out=32)
    assert direct.k == 6 and ctx(kernel_size=None, k=27).k == 27
    made = routes.context("conv3d", "cpu", map_kind="forward", dtype="float32", kernel_size=(3, 1, 2),
                          c_in=16, c_out=32)
    assert made.k == 6 and made.tier == ml.diagnostics.capability_tier("cpu")
    assert made == direct._replace(tier=made.tier) and hash(made) == hash(direct._replace(tier=made.tier))
    assert made.as_dict()["k"] == 6 and RouteContext(**made.as_dict()) == made
    with pytest.raises(AttributeError):
        made.k = 1


def test_list_routes_and_docs_in_sync():
    rows = routes.list_routes()
    names = [r["name"] for r in rows]
    assert {"cpu.pointwise", "cpu.gather_gemm", "cpu.wgrad_gemm", "metal.pointwise",
            "metal.fetch_on_demand", "metal.wgrad_direct"} <= set(names)
    for r in rows:
        assert r["backend"] in routes.BACKENDS and r["predicate"]
    assert (ROOT / "docs" / "routes.md").read_text() == routes.markdown(), (
        "docs/routes.md is stale: regenerate with `python -m mlx_lattice routes --markdown > docs/routes.md`"
    )


def _primitive(route) -> str:
    """The primitive a registry route runs under, from its passes and predicate."""
    if route.passes == ("wgrad",):
        return "weight_grad"
    if route.passes == ("map",):
        return "map"
    if set(route.passes) <= set(routes.NEIGHBOR_PASSES):
        return "neighbors"
    if any(c.text.startswith("quantized weight") for c in route.conditions):
        return "quantized"
    return "conv"


def test_route_tables_name_exactly_the_registry_routes():
    # Each route is defined once per backend: the C++ tables (CPU, Metal) and
    # the CUDA table hold one entry per registry route and nothing else, under
    # the primitive the registry implies, in the file the registry names.
    from mlx_lattice import _ext
    from mlx_lattice.backends import cuda

    native = {name: op for name, op, _ in _ext.native_routes()}
    assert len(native) == len(_ext.native_routes()), "a route is defined twice"
    # "grouped" is one fact: a C++ entry's kernels take grouped products
    # exactly where the registry selects it for them
    for name, _, grouped in _ext.native_routes():
        assert grouped == routes.get(name).grouped, name
    from mlx_lattice import backends

    map_routes = {backends.get(b).map_route: "map" for b in ("cpu", "metal")}
    neighbor_routes = {name: "neighbors" for b in backends.NAMES for name in backends.get(b).neighbor_routes}
    assert len(neighbor_routes) == 2 * len(backends.NAMES), "a k-nearest and a radius route per backend"
    tables = {**native, **map_routes, **neighbor_routes, **{name: r.op for name, r in cuda.ROUTES.items()}}
    registry = {r.name: r for r in routes._REGISTRY.values()}
    assert set(tables) == set(registry)
    for name, route in registry.items():
        assert tables[name] == _primitive(route), name
        entry = (ROOT / route.table_file).read_text()
        assert f'"{name}"' in entry, f"{name}: no entry in {route.table_file}"
        assert (ROOT / route.kernel_file).is_file(), route.kernel_file


def test_route_tables_refuse_unknown_routes_and_wrong_primitives():
    from mlx_lattice import _ext
    from mlx_lattice.backends import cuda

    with pytest.raises(ValueError, match="no CUDA route named 'cuda.nonexistent'"):
        cuda.find("cuda.nonexistent", "conv")
    with pytest.raises(ValueError, match="'cuda.wgrad_mma' computes a weight_grad product, not conv"):
        cuda.find("cuda.wgrad_mma", "conv")
    assert cuda.find("cuda.fetch_on_demand", "conv").run is cuda.routes.fetch_on_demand

    x = mx.ones((4, 8))
    w = mx.ones((1, 8, 8))
    with pytest.raises(ValueError, match="no CPU or Metal route named cpu.nonexistent"):
        _ext.gather_conv(x, w, None, _ext.View.output_major, "cpu.nonexistent")
    with pytest.raises(ValueError, match="cpu.wgrad_gemm runs under the weight_grad primitive"):
        _ext.gather_conv(x, w, None, _ext.View.output_major, "cpu.wgrad_gemm")
    inputs = _ext.conv_inputs(x, w, None, _ext.View.output_major, "metal.pointwise")
    with pytest.raises(ValueError, match="no Metal route named metal.nonexistent"):
        _ext.metal_program("conv", "metal.nonexistent", inputs, [4, 8], mx.float32)
    with pytest.raises(ValueError, match="metal.wgrad_fp16 runs under the weight_grad primitive"):
        _ext.metal_program("conv", "metal.wgrad_fp16", inputs, [4, 8], mx.float32)


def test_selection_is_pure_and_explains_rejections():
    c = ctx(kernel_size=(1, 1, 1))
    s = routes.select(c)
    assert s.route.name == "cpu.pointwise" and s.fallback is None
    reasons = {r["route"]: r["reason"] for r in s.rejected}
    assert reasons["cpu.gather_gemm"].startswith("lower priority")
    assert "backend is cpu" in reasons["metal.pointwise"]
    s2 = routes.select(ctx(kernel_size=(1, 1, 1), padding=(1, 0, 0), c_in=32))
    assert s2.route.name == "cpu.gather_gemm"
    # a failed requirement is said to be unmet, with the call's values
    assert {r["route"]: r["reason"] for r in s2.rejected}["cpu.pointwise"] == (
        "requires no padding/dilation, not met: padding=(1, 0, 0), dilation=(1, 1, 1)")
    assert routes.select(ctx(kernel_size=(1, 1, 1), explicit_target=True, map_kind="target", c_in=32)).route.name == "cpu.gather_gemm"
    # a Mac would take the Metal routes for the same shapes
    assert routes.select(ctx(backend="metal", kernel_size=(1, 1, 1))).route.name == "metal.pointwise"
    assert routes.select(ctx(backend="metal", c_in=8, c_out=8)).route.name == "metal.csr_mma"
    assert routes.select(ctx(backend="metal", dtype="bfloat16")).route.name == "metal.csr_mma"
    # grouped bfloat16 products stay on the GPU: groups of 4 channels on the
    # scalar grouped kernels, groups of 8 and more on the matrix units
    s3 = routes.select(ctx(backend="metal", dtype="bfloat16", groups=2, c_in=8, c_out=8))
    assert s3.route.name == "metal.grouped_fetch_on_demand" and s3.fallback is None
    assert {r["route"]: r["reason"] for r in s3.rejected}["metal.grouped_csr_mma"] == (
        "requires C_in / groups >= 8 and C_out / groups >= 8, not met: c_in=8, groups=2, c_out=8")
    s4 = routes.select(ctx(backend="metal", dtype="bfloat16", groups=2, c_in=16, c_out=16))
    assert s4.route.name == "metal.grouped_csr_mma" and s4.fallback is None


def test_row_gather_takes_narrow_inputs():
    # the stem (4 -> 16, K 27): a 27 KiB weight panel
    assert routes.select(ctx(c_in=4, c_out=16)).route.name == "cpu.row_gather"
    assert routes.select(ctx(c_in=4, c_out=16, direction="dgrad")).route.name == "cpu.row_gather"
    assert routes.select(ctx(c_in=8, c_out=16, kernel_size=(2, 2, 2))).route.name == "cpu.row_gather"
    # 16-channel strided layers (8 offsets), both passes
    assert routes.select(ctx(c_in=16, c_out=16, kernel_size=(2, 2, 2), stride=(2, 2, 2))).route.name == "cpu.row_gather"
    assert routes.select(ctx(c_in=16, c_out=32, kernel_size=(2, 2, 2), direction="dgrad")).route.name == "cpu.row_gather"
    assert routes.select(ctx(c_in=32, c_out=32, kernel_size=(2, 2, 2))).route.name == "cpu.gather_gemm"
    # wider inputs, or a panel past 32 KiB (8 x 64 x 27 x 4 bytes), keep the grouped traversal
    s = routes.select(ctx(c_in=16, c_out=16))
    assert s.route.name == "cpu.gather_gemm"
    assert {r["route"]: r["reason"] for r in s.rejected}["cpu.row_gather"].startswith("requires (C_in <= 8")
    assert routes.select(ctx(c_in=8, c_out=64)).route.name == "cpu.gather_gemm"
    assert routes.select(ctx(c_in=4, c_out=16, quantized=True)).route.name == "cpu.quantized_gather_gemm"
    # 1x1x1 products without a relation stay pointwise
    assert routes.select(ctx(c_in=4, c_out=16, kernel_size=(1, 1, 1))).route.name == "cpu.pointwise"


def test_register_rejects_duplicates():
    with pytest.raises(ValueError, match="already registered"):
        routes.register(routes.get("cpu.pointwise"))


def test_selection_cached_per_context(monkeypatch):
    # The memo answers as the registry does, hands out fresh rejection
    # records, and is emptied when a route is registered.
    c = ctx(c_in=16, c_out=16)
    first, again = routes.select(c), routes.select(c)
    uncached = routes._select(c)
    assert first.route is again.route is uncached[0]
    assert first.rejected == again.rejected == list(uncached[1])
    first.rejected[0]["reason"] = "changed by the caller"
    assert routes.select(c).rejected[0]["reason"] != "changed by the caller"
    assert c in routes._SELECTED
    monkeypatch.setattr(routes, "_REGISTRY", dict(routes._REGISTRY))
    monkeypatch.setattr(routes, "_SELECTED", {c: routes._SELECTED[c]})
    best = routes.register(routes.Route(
        name="cpu.test_only", backend="cpu", priority=10_000, conditions=(),
    ))
    assert not routes._SELECTED
    assert routes.select(c).route is best
    # Bounded: sizes change with the data, so contexts need not repeat.
    monkeypatch.setattr(routes, "_SELECTED_MAX", 3)
    for n in range(10):
        routes.select(ctx(c_in=16, c_out=16, n_in=100 + n))
        assert len(routes._SELECTED) <= 3


REQUIRED = {"op", "route", "backend", "rejected", "map_kind", "dtype", "quantized", "k", "c_in", "c_out", "n_out", "edges", "tier"}


def test_diagnostics_record_and_env_log(rng, tmp_path, monkeypatch, on_cpu):
    log_path = tmp_path / "routes.jsonl"
    monkeypatch.setenv("MLX_LATTICE_ROUTE_LOG", str(log_path))
    coords = oracle.random_coords(rng, 40, 5, 1)
    x = ml.SparseTensor(coords, rng.standard_normal((len(coords), 3)).astype(np.float32))
    with ml.diagnostics.record() as log:
        y = ops.subm_conv3d(x, mx.zeros((4, 3, 3, 3, 3)))
        ops.conv3d(y, mx.zeros((2, 1, 1, 1, 4)))
    assert [r["route"] for r in log] == ["cpu.row_gather", "cpu.pointwise"]
    rec = log[0]
    assert REQUIRED <= set(rec)
    assert rec["map_kind"] == "submanifold" and rec["k"] == 27 and rec["c_in"] == 3 and rec["c_out"] == 4
    assert rec["n_out"] == len(coords) and rec["edges"] == len(oracle.conv_edges(coords, coords, 3, 1, 1))
    assert rec["quantized"] is False and rec["tier"] == f"cpu:{_ext.cpu_isa()}" and rec["coord_dtype"] == "int32"
    assert all({"route", "reason"} <= set(r) for r in rec["rejected"])
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    # the file also takes the map records (op "map"): x's table, the relation
    assert [l["route"] for l in lines if l["op"] != "map"] == ["cpu.row_gather", "cpu.pointwise"]
    assert [l["product"] for l in lines if l["op"] == "map"] == ["table", "relation"]
    assert json.loads(log.to_json())[1]["op"] == "conv3d"
    assert "cpu.pointwise" in log.table()


def test_backward_routes_go_through_registry(rng, on_cpu):
    coords = oracle.random_coords(rng, 40, 5, 1)
    x = ml.SparseTensor(coords, rng.standard_normal((len(coords), 3)).astype(np.float32))
    w = mx.zeros((4, 3, 3, 3, 3))
    wp = mx.zeros((2, 1, 1, 1, 3))
    with ml.diagnostics.record() as log:
        mx.grad(lambda f, w: ops.subm_conv3d(x.replace(f), w).feats.sum(), argnums=(0, 1))(x.feats, w)
        mx.grad(lambda f, w: ops.conv3d(x.replace(f), w).feats.sum(), argnums=(0, 1))(x.feats, wp)
    by_dir = {(r["direction"], r["route"]) for r in log}
    assert ("forward", "cpu.row_gather") in by_dir  # 3 input channels
    assert ("dgrad", "cpu.row_gather") in by_dir  # the product's 4 input channels
    assert ("wgrad", "cpu.wgrad_gemm") in by_dir
    assert ("dgrad", "cpu.pointwise") in by_dir
    dgrad = next(r for r in log if r["direction"] == "dgrad" and r["map_kind"] == "submanifold")
    assert dgrad["c_in"] == 4 and dgrad["c_out"] == 3 and dgrad["k"] == 27
    assert REQUIRED <= set(dgrad)
    # a Mac would run the same backward passes on its Metal routes
    assert routes.select(ctx(backend="metal", direction="wgrad")).route.name == "metal.wgrad_mma"
    assert routes.select(ctx(backend="metal", direction="dgrad")).route.name == "metal.csr_mma"


def test_metal_capability_tiers():
    caps = ml.diagnostics.metal_capabilities("applegpu_g17s", "26.2")
    assert caps["generation"] == 17 and caps["tensor_ops"] and "tensorops=yes" in caps["tier"]
    # MLX gates its neural-accelerator kernels at 26.2; so do we
    assert not ml.diagnostics.metal_capabilities("applegpu_g17s", "26.1")["tensor_ops"]
    assert not ml.diagnostics.metal_capabilities("applegpu_g15p", "26.0")["tensor_ops"]
    assert not ml.diagnostics.metal_capabilities("applegpu_g17s", "15.5")["tensor_ops"]


def test_route_log_says_why_other_routes_were_not_taken():
    coords = np.array([[0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0]], np.int32)
    x = ml.SparseTensor(coords, mx.ones((3, 8)))
    with ml.diagnostics.record() as log:
        ops.subm_conv3d(x, mx.ones((16, 3, 3, 3, 8)))
        ops.conv3d(x, mx.ones((4, 1, 1, 1, 8)))
    lines = log.why().splitlines()
    heads = [ln for ln in lines if not ln.startswith("  ")]
    assert len(heads) == 2
    assert heads[0].startswith("subm_conv3d (submanifold, float32, K=27, 8->16, forward): ")
    first = log[0]
    taken = first["route"]
    assert heads[0].endswith(taken)
    family = taken.split(".")[0] + "."
    # every rejection of the taken route's backend that concerns this pass, none of another backend's
    expected = [f"  not {r['route']}: {r['reason']}" for r in first["rejected"]
                if r["route"].startswith(family) and not r["reason"].startswith("route serves")]
    assert expected and lines[1 : 1 + len(expected)] == expected
    assert not any(ln.startswith("  not ") and not ln.startswith(f"  not {family}") for ln in lines)
    assert heads[1].startswith("conv3d (forward, float32, K=1, 8->4, forward): ")


# A spread of contexts over backends, passes, dtypes, shapes and groups.
SPREAD = [ctx(backend=b, dtype=d, direction=p, kernel_size=ks, stride=st, c_in=ci, c_out=co, groups=g,
              n_out=n, edges=4 * n, tier=f"{b}:test", quantized=q, group_size=ci if q else 0)
          for b in ("cpu", "metal", "cuda") for d in ("float32", "float16") for p in ("forward", "dgrad", "wgrad")
          for ks, st in (((3, 3, 3), (1, 1, 1)), ((1, 1, 1), (1, 1, 1)), ((2, 2, 2), (2, 2, 2)))
          for ci, co, g, n, q in ((16, 16, 1, 100, False), (32, 64, 1, 70000, False), (8, 8, 2, 5000, False),
                                  (32, 32, 1, 9000, True))]


def _first_unmet(route, c):
    """The first of a route's own conditions that c fails, evaluated here."""
    return next((cond for cond in route.conditions if not cond.test(c)), None)


def test_a_failed_requirement_is_said_to_be_unmet_with_the_calls_values():
    checked = 0
    for c in SPREAD:
        for r in routes._REGISTRY.values():
            why = r.failed(c)
            if r.backend != c.backend or c.direction not in r.passes:
                assert why.startswith(("backend is ", "route serves ")), why
                continue
            if (c.groups > 1) != r.grouped:
                assert why == (f"requires {routes.GROUPED_TEXT}, not met: groups={c.groups}" if r.grouped else
                               "requires groups == 1 (grouped products take a grouped route), not met: "
                               f"groups={c.groups}")
                continue
            cond = _first_unmet(r, c)
            if cond is None:
                assert why is None and r.applies(c)
                continue
            assert not r.applies(c)
            # the requirement, said to be unmet, then each field it read
            # with this call's value: never the bare requirement
            head, values = why.split(", not met: ")
            assert head == f"requires {cond.text}" and why != cond.text
            names = re.findall(r"(?:^|, )(\w+)=", values)
            assert names and values == ", ".join(f"{f}={getattr(c, f)}" for f in names), (why, c)
            checked += 1
    assert checked > 500


def test_every_condition_names_the_fields_it_reads():
    # so that an unmet one can say what the call has instead
    for r in routes._REGISTRY.values():
        for cond in r.conditions:
            assert cond.reads and set(cond.reads) <= set(routes.RouteContext._fields), (r.name, cond.text)
    k27 = metal_routes.K27
    assert k27.reads == ("k",) and metal_routes.SQUARE_32_64.reads == ("c_in", "c_out")
    assert k27.unmet(ctx(kernel_size=(2, 2, 2))) == "requires K == 27, not met: k=8"


def test_why_reads_as_unmet_and_says_a_fallback():
    c = ctx(backend="metal", dtype="float64", c_in=16, c_out=16, n_out=100, edges=1000, tier="metal:test")
    with ml.diagnostics.record() as log:
        routes.choose(c)
    lines = log.why().splitlines()
    assert lines[0] == "conv3d (forward, float64, K=27, 16->16, forward): cpu.gather_gemm"
    # the GPU's routes, why each failed; no CPU route ("backend is metal")
    assert "  not metal.vec4: requires features float32, not met: dtype=float64" in lines
    assert "  not metal.dense_channel: requires output capacity >= 4096, not met: n_out=100" in lines
    assert not [ln for ln in lines if ln.startswith("  not cpu.") or "backend is" in ln]
    assert lines[-1] == "  ran on the CPU: no metal route accepts this call; running on the CPU"
