"""The route tuner (mlx_lattice/tuning.py): modes, explicit routes, the
cache key and its invalidation, the cache file under concurrent writers and
corruption, measurement bounds and checks, diagnostics, determinism, the
CUDA candidates (tile shapes, through stubs), and the tune command."""

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import backends, diagnostics, ops, route_conditions, routes, tuning, tuning_cache
from mlx_lattice.routes import RouteContext
from mlx_lattice.tuning_cache import TuningCache

import oracle

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def cache_file(tmp_path, monkeypatch):
    """A fresh tuner per test, its cache in tmp_path; settings, explicit
    routes and timer put back after."""
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("MLX_LATTICE_TUNE_CACHE", str(path))
    state = tuning._state
    saved = (tuning.settings(), dict(state.forced), state.timer)
    tuning.reset()
    tuning_cache._warned.clear()
    yield path
    tuning.reset()
    state.settings, state.forced, state.timer = saved


def costs(table: dict, default=1.0):
    """A deterministic timer: seconds per candidate label (or route name)."""
    def timer(label, fn):
        return table.get(label, table.get(label.split("[")[0], default))
    return timer


FAST_GATHER = costs({"cpu.gather_gemm": 0.5e-3, "cpu.row_gather": 1e-3})
FAST_ROW = costs({"cpu.gather_gemm": 1e-3, "cpu.row_gather": 0.5e-3})


def strided(rng, n=300, c=16, extent=8):
    """A stride-2 2x2x2 conv of c -> c channels: on the CPU its forward and
    input-gradient products may take cpu.row_gather or cpu.gather_gemm."""
    coords = oracle.random_coords(rng, n, extent, 1)
    x = ml.SparseTensor(coords, rng.standard_normal((len(coords), c)).astype(np.float32))
    w = mx.array((rng.standard_normal((c, 2, 2, 2, c)) * 0.1).astype(np.float32))
    return x, w


def run(x, w):
    return ops.conv3d(x, w, stride=2)


def convs(log, direction=None):
    return [r for r in log if r["op"] != "map" and (direction is None or r["direction"] == direction)]


def cpu_ctx(**kw):
    base = dict(op="conv3d", map_kind="forward", dtype="float32", backend="cpu", kernel_size=(2, 2, 2),
                stride=(2, 2, 2), c_in=16, c_out=16, n_in=5000, n_out=900, edges=5000, tier="cpu:test")
    base.update(kw)
    return RouteContext(**base)


def cuda_ctx(**kw):
    base = dict(op="subm_conv3d", map_kind="submanifold", dtype="float16", backend="cuda",
                kernel_size=(3, 3, 3), padding=(1, 1, 1), c_in=64, c_out=64, n_in=5000, n_out=5000,
                edges=60000, tier="cuda")
    base.update(kw)
    return RouteContext(**base)


# ------------------------------------------------------------------ modes
def test_modes_off_cached_tune(rng, on_cpu, cache_file):
    x, w = strided(rng)
    with tuning.using(mode="off"), diagnostics.record() as log:
        y_static = run(x, w).feats
    [rec] = convs(log)
    assert rec["route"] == "cpu.row_gather" and rec["choice"] == "static" and rec["timings_ms"] is None

    with tuning.using(mode="tune", timer=FAST_GATHER), diagnostics.record() as log:
        y_tuned = run(x, w).feats
    [rec] = convs(log)
    assert rec["route"] == "cpu.gather_gemm" and rec["choice"] == "tuner"
    assert set(rec["timings_ms"]) == {"cpu.gather_gemm", "cpu.row_gather"}
    # the two CPU routes make the same sums, bit for bit
    np.testing.assert_array_equal(np.array(y_static), np.array(y_tuned))
    entries = TuningCache(cache_file).load()
    # the forward product and the input gradient it will have (the weight
    # gradient has one route on the CPU)
    assert sorted(e["shape"]["pass"] for e in entries.values()) == ["dgrad", "forward"]
    assert all(e["route"] == "cpu.gather_gemm" and e["static"] == "cpu.row_gather" for e in entries.values())

    tuning.reset()
    with tuning.using(mode="cached"), diagnostics.record() as log:
        run(x, w)
    [rec] = convs(log)
    assert rec["route"] == "cpu.gather_gemm" and rec["choice"] == "cache"

    tuning.reset()
    with tuning.using(mode="off"), diagnostics.record() as log:
        run(x, w)
    assert convs(log)[0]["route"] == "cpu.row_gather"

    tuning.reset()
    with tuning.using(mode="cached", cache_path=str(cache_file.with_name("empty.json"))), \
            diagnostics.record() as log:
        run(x, w)
    [rec] = convs(log)
    assert rec["route"] == "cpu.row_gather" and rec["choice"] == "static"
    assert "no entry" in rec["tune_note"]


def test_mode_settings_and_environment(monkeypatch):
    with pytest.raises(ValueError):
        tuning.set_mode("sometimes")
    with pytest.raises(TypeError):
        tuning.configure(budget=3)
    with tuning.using(mode="tune", budget_s=0.5):
        assert tuning.mode() == "tune" and tuning.settings().budget_s == 0.5
    assert tuning.mode() == "off"  # the test suite's mode (tests/conftest.py)
    monkeypatch.setenv("MLX_LATTICE_TUNE", "tune")
    monkeypatch.setenv("MLX_LATTICE_TUNE_BUDGET", "2.5")
    s = tuning._env_settings()
    assert s.mode == "tune" and s.budget_s == 2.5
    monkeypatch.delenv("MLX_LATTICE_TUNE")
    assert tuning._env_settings().mode == tuning.DEFAULT_MODE == "cached"
    monkeypatch.setenv("MLX_LATTICE_TUNE", "always")
    with pytest.warns(RuntimeWarning, match="MLX_LATTICE_TUNE"):
        assert tuning._env_settings().mode == "cached"
    monkeypatch.setenv("MLX_LATTICE_ROUTE_WGRAD", "cpu.wgrad_gemm, metal.wgrad_direct")
    monkeypatch.setenv("MLX_LATTICE_ROUTE_FORWARD", "cpu.no_such_route")
    with pytest.warns(RuntimeWarning, match="MLX_LATTICE_ROUTE_FORWARD"):
        forced = tuning._env_forced()
    assert forced == {"wgrad": ("cpu.wgrad_gemm", "metal.wgrad_direct")}


def test_explicit_route_per_pass(rng, on_cpu):
    x, w = strided(rng)
    with tuning.using(mode="off"), tuning.force(forward="cpu.gather_gemm"), diagnostics.record() as log:
        run(x, w)
    [rec] = convs(log)
    assert rec["route"] == "cpu.gather_gemm" and rec["choice"] == "forced"
    assert rec["rejected"][0] == {"route": "cpu.row_gather", "reason": "cpu.gather_gemm is named for this pass"}
    assert "named explicitly" in log.why()
    # a named route whose predicate fails is not taken, and the record says why
    xs = ml.SparseTensor(x.coords, mx.zeros((len(x), 32)))
    with tuning.force(forward="cpu.row_gather"), diagnostics.record() as log:
        ops.subm_conv3d(xs, mx.zeros((32, 3, 3, 3, 32)))
    [rec] = convs(log)
    assert rec["route"] == "cpu.gather_gemm" and rec["choice"] == "static"
    assert "cpu.row_gather does not apply" in rec["tune_note"]
    # per pass: the backward products keep the static order
    with tuning.force(dgrad=["metal.fetch_on_demand", "cpu.gather_gemm"]), diagnostics.record() as log:
        mx.grad(lambda f, w: run(x.replace(f), w).feats.sum(), argnums=(0, 1))(x.feats, w)
    by_pass = {r["direction"]: r for r in convs(log)}
    assert by_pass["dgrad"]["route"] == "cpu.gather_gemm" and by_pass["dgrad"]["choice"] == "forced"
    assert by_pass["forward"]["route"] == "cpu.row_gather" and by_pass["forward"]["choice"] == "static"
    assert tuning._state.forced == {}
    with pytest.raises(ValueError, match="no route named"):
        tuning.set_forced(forward="cpu.fastest")
    with pytest.raises(ValueError, match="serves wgrad"):
        tuning.set_forced(forward="cpu.wgrad_gemm")


# ------------------------------------------------------------------ candidates and keys
CONTEXTS = [
    cpu_ctx(),
    cpu_ctx(direction="dgrad"),
    cpu_ctx(direction="wgrad"),
    cpu_ctx(kernel_size=(3, 3, 3), stride=(1, 1, 1), map_kind="submanifold", c_in=4),
    cpu_ctx(kernel_size=(1, 1, 1), stride=(1, 1, 1), c_in=8),  # pointwise: no relation
    cpu_ctx(groups=4),
    RouteContext(op="conv3d", map_kind="submanifold", dtype="float16", backend="metal", kernel_size=(3, 3, 3),
                 c_in=32, c_out=32, n_in=300, n_out=300, edges=2000, tier="metal:test"),
    RouteContext(op="conv3d", map_kind="forward", dtype="float32", backend="metal", kernel_size=(3, 3, 3),
                 c_in=7, c_out=13, n_in=300, n_out=300, edges=2000, tier="metal:test"),
    RouteContext(op="conv3d", map_kind="forward", dtype="float32", backend="metal", kernel_size=(3, 3, 3),
                 c_in=16, c_out=16, n_in=9000, n_out=9000, edges=90000, tier="metal:test"),
    cuda_ctx(),
    cuda_ctx(direction="wgrad"),
    cuda_ctx(dtype="float32"),
]


@pytest.mark.parametrize("ctx", CONTEXTS, ids=lambda c: f"{c.backend}-{c.dtype}-{c.direction}-{c.c_in}x{c.c_out}")
def test_candidates_are_eligible_routes_static_first(ctx):
    cands = tuning.candidates(ctx)
    static = routes.select(ctx).route
    assert cands[0] == tuning.Candidate(static.name)
    assert len(set(cands)) == len(cands)
    for c in cands:
        r = routes.get(c.route)
        assert r.backend == ctx.backend and r.failed(ctx) is None
        assert r.deterministic or not static.deterministic
    if tuning._pointwise(ctx):
        assert len(cands) == 1
    # every other eligible deterministic route of the backend is there
    others = {r.name for r in routes._REGISTRY.values()
              if r.backend == ctx.backend and r.failed(ctx) is None and r.deterministic}
    if not tuning._pointwise(ctx) and static.deterministic:
        assert {c.route for c in cands} == others


def test_cuda_candidates_enumerate_tile_shapes():
    from mlx_lattice.backends.cuda import routes as table
    from mlx_lattice.backends.cuda.kernels import sorted_mma_shared_bytes

    fwd = tuning.candidates(cuda_ctx(c_in=64, c_out=128))
    assert fwd[:2] == [tuning.Candidate("cuda.sorted_mma"), tuning.Candidate("cuda.fetch_on_demand")]
    tiles = [c.kwargs for c in fwd if c.route == "cuda.sorted_mma" and c.variant and "bn" in c.kwargs]
    assert {"bn": 64, "ak": 64} in tiles and {"bn": 128, "ak": 32} in tiles and len(tiles) >= 6
    # the default tiles with the other row tile (64 rows by default)
    assert {"tm": 128} in [c.kwargs for c in fwd if c.route == "cuda.sorted_mma"]
    limit = max(table.SHARED_LIMIT, sorted_mma_shared_bytes(64, 128))
    for t in tiles:
        assert 128 % t["bn"] == 0 and 64 % t["ak"] == 0
        assert sorted_mma_shared_bytes(64, 128, t["ak"], t["bn"]) <= limit
    assert "cuda.sorted_mma[ak=32,bn=128]" in {c.label for c in fwd}

    wg = tuning.candidates(cuda_ctx(direction="wgrad", c_in=32, c_out=64))
    assert wg[:2] == [tuning.Candidate("cuda.wgrad_mma"), tuning.Candidate("cuda.wgrad_direct")]
    kw = [c.kwargs for c in wg if c.variant]
    assert {"ta": 16, "tb": 64} in kw and {"chunk": 128} in kw and {"chunk": 512} in kw
    assert all(32 % k.get("ta", 32) == 0 and 64 % k.get("tb", 64) == 0 for k in kw)
    # float32 products have no tensor-core route: one candidate, nothing to tune
    assert tuning._key_info(cuda_ctx(dtype="float32"), routes.select(cuda_ctx(dtype="float32")).route) is None


def test_key_fields_and_buckets(restore_isa):
    base = cpu_ctx(edges=70000, n_out=20000)
    key = tuning._key_info(base, routes.select(base).route)[0]
    for part in ("cpu", "float32", "forward", "K=8", "16->16", "groups=1", "edges<2^17", "rows<2^15",
                 "cpu.gather_gemm,cpu.row_gather", f"mlx_lattice {ml.__version__}", "threads"):
        assert part in key
    assert backends.CPU.device_name().split(" (")[0] in key

    def key_of(**kw):
        c = RouteContext(**{**base.as_dict(), **kw})
        info = tuning._key_info(c, routes.select(c).route)
        return info and info[0]

    # the same bucket of edges and rows: the same key
    assert key_of(edges=80000, n_out=30000, n_in=7) == key
    # every field of the key tells shapes apart
    for kw in (dict(edges=140000), dict(n_out=40000), dict(dtype="float16"), dict(direction="dgrad"),
               dict(map_kind="transposed"), dict(c_out=8), dict(c_in=8), dict(tier="cpu:avx2")):
        other = key_of(**kw)
        assert other is None or other != key, kw
    k27 = dict(kernel_size=(3, 3, 3), k=27, stride=(1, 1, 1), map_kind="submanifold", c_in=4)
    assert key_of(**k27) != key_of(**{**k27, "k": 8}) and key_of(**k27) != key_of(**{**k27, "c_in": 5})
    # the device: another thread count is another machine configuration
    ml.set_num_threads(1 if ml.num_threads() != 1 else 2)
    assert key_of() != key


def test_key_invalidated_by_a_new_route_and_a_new_version(rng, on_cpu, cache_file, monkeypatch):
    x, w = strided(rng)
    with tuning.using(mode="tune", timer=FAST_GATHER):
        run(x, w)
    assert len(TuningCache(cache_file).load()) == 2

    def cached_route():
        tuning.reset()
        with tuning.using(mode="cached"), diagnostics.record() as log:
            run(x, w)
        return convs(log)[0]

    assert cached_route()["choice"] == "cache"
    # a package release: the same shapes are new keys
    monkeypatch.setattr(ml, "__version__", "99.0")
    rec = cached_route()
    assert rec["choice"] == "static" and rec["route"] == "cpu.row_gather"
    monkeypatch.undo()
    monkeypatch.setenv("MLX_LATTICE_TUNE_CACHE", str(cache_file))
    assert cached_route()["choice"] == "cache"
    # a route registered whose predicate holds: another candidate set, another key
    monkeypatch.setattr(routes, "_REGISTRY", dict(routes._REGISTRY))
    monkeypatch.setattr(routes, "_SELECTED", {})
    routes.register(routes.Route(name="cpu.test_only_gather", backend="cpu", priority=-1,
                                 conditions=(route_conditions.DENSE,), passes=("forward", "dgrad")))
    rec = cached_route()
    assert rec["choice"] == "static" and rec["route"] == "cpu.row_gather"


# ------------------------------------------------------------------ the cache file
def test_cache_corrupt_or_foreign_files_are_ignored_with_a_warning(rng, on_cpu, cache_file):
    x, w = strided(rng)
    cases = [("{not json", "not valid JSON", False), ('{"entries": {}}', "not a route tuning cache", False),
             (json.dumps({"format": tuning_cache.FORMAT, "version": 999, "entries": {}}),
              "format version 999 \\(a newer mlx_lattice's\\)", False),
             (json.dumps({"format": tuning_cache.FORMAT, "version": 0, "entries": {}}), "format version 0", True)]
    for text, match, replaced in cases:
        cache_file.write_text(text)
        tuning.reset()
        tuning_cache._warned.clear()
        with pytest.warns(RuntimeWarning, match=match):
            with tuning.using(mode="cached"), diagnostics.record() as log:
                run(x, w)
        assert convs(log)[0]["route"] == "cpu.row_gather"
        # mode tune: an older cache is rewritten whole; a file that is not
        # a cache (someone else's?) or a newer release's is left as it is,
        # and the choice holds for the process, with a warning
        tuning.reset()
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            with tuning.using(mode="tune", timer=FAST_GATHER), diagnostics.record() as log:
                run(x, w)
        assert convs(log)[0]["route"] == "cpu.gather_gemm"
        if replaced:
            data = json.loads(cache_file.read_text())
            assert data["format"] == tuning_cache.FORMAT and data["version"] == tuning_cache.FORMAT_VERSION
            assert len(data["entries"]) == 2
        else:
            assert cache_file.read_text() == text
            assert any("cannot write the cache" in str(m.message) and str(cache_file) in str(m.message)
                       for m in said)
    # malformed entries are skipped (with a warning naming the file and the
    # entry), the others kept
    data = json.loads(cache_file.read_text())
    data["entries"]["broken"] = {"variant": 3}
    cache_file.write_text(json.dumps(data))
    with pytest.warns(RuntimeWarning, match=f"{cache_file}: entry 'broken': 'route' is None"):
        assert len(TuningCache(cache_file).load()) == 2
    # an unreadable directory entry: a warning, no entries
    bad = TuningCache(cache_file.parent)
    with pytest.warns(RuntimeWarning, match="unreadable"):
        assert bad.load() == {}


def test_cache_merge_keeps_the_first_writer(cache_file):
    c = TuningCache(cache_file)
    assert c.merge({"k": {"route": "a", "variant": {}}})["k"]["route"] == "a"
    held = c.merge({"k": {"route": "b", "variant": {}}, "j": {"route": "b", "variant": {}}})
    assert held["k"]["route"] == "a" and held["j"]["route"] == "b"
    assert c.remove(["j"]) == 1 and set(c.load()) == {"k"}
    assert c.remove() == 1 and c.load() == {}
    assert not list(cache_file.parent.glob("*.tmp"))


WRITER = textwrap.dedent("""
    import json, sys
    from mlx_lattice.tuning_cache import TuningCache
    path, me = sys.argv[1], int(sys.argv[2])
    c = TuningCache(path)
    shared = None
    for i in range(25):
        held = c.merge({f"p{me}-{i}": {"route": f"r{me}", "variant": {}},
                        "shared": {"route": f"r{me}", "variant": {}}})
        assert shared is None or held["shared"] == shared, "the shared key changed under a process"
        shared = held["shared"]
    print(json.dumps(shared["route"]))
""")


def test_cache_safe_under_concurrent_processes(cache_file):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(cache_file), str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    adopted = {json.loads(o[0]) for o in outs}
    assert len(adopted) == 1  # every process took the first writer's route
    entries = TuningCache(cache_file).load()
    assert len(entries) == 4 * 25 + 1
    assert entries["shared"]["route"] in adopted
    assert not list(cache_file.parent.glob("*.tmp"))


def test_tuner_adopts_another_processes_choice(rng, on_cpu, cache_file, monkeypatch):
    # Another process writes the key while this one measures: the first
    # writer's route is taken, so that processes sharing a cache agree.
    x, w = strided(rng)
    real = tuning.measure

    def racing(ctx, run_, cands, timer=None):
        m = real(ctx, run_, cands, timer)
        key = tuning._key_info(ctx, routes.get(cands[0].route))[0]
        TuningCache(cache_file).merge({key: {"route": "cpu.row_gather", "variant": {}, "note": "other"}})
        return m

    monkeypatch.setattr(tuning, "measure", racing)
    with tuning.using(mode="tune", timer=FAST_GATHER), diagnostics.record() as log:
        run(x, w)
    [rec] = convs(log)
    assert rec["route"] == "cpu.row_gather" and rec["choice"] == "cache"


# ------------------------------------------------------------------ measuring
def test_measurement_rounds_and_budget(rng, on_cpu):
    calls = []

    def timer(per_call):
        def t(label, fn):
            calls.append(label)
            return per_call
        return t

    ctx = cpu_ctx()
    cands = tuning.candidates(ctx)
    out = mx.zeros((4, 4))
    with tuning.using(min_rounds=3, max_rounds=10, per_candidate_s=0.01):
        m = tuning.measure(ctx, lambda r, kw: out, cands, timer(1.0))  # slow: min_rounds
        assert len(calls) == 3 * len(cands) and m.winner == cands[0]
        calls.clear()
        tuning.measure(ctx, lambda r, kw: out, cands, timer(1e-6))  # fast: max_rounds
        assert len(calls) == 10 * len(cands)
    # margin: another route must be clearly faster than the static one
    with tuning.using(margin=0.05):
        assert tuning.measure(ctx, lambda r, kw: out, cands,
                              costs({"cpu.row_gather": 1.0, "cpu.gather_gemm": 0.97})).winner == cands[0]
        assert tuning.measure(ctx, lambda r, kw: out, cands,
                              costs({"cpu.row_gather": 1.0, "cpu.gather_gemm": 0.9})).winner.route == "cpu.gather_gemm"
    # a spent budget: no measurement, the static order, and the record says so
    x, w = strided(rng)
    with tuning.using(mode="tune", budget_s=0.0, timer=FAST_GATHER), diagnostics.record() as log:
        run(x, w)
    [rec] = convs(log)
    assert rec["route"] == "cpu.row_gather" and "budget" in rec["tune_note"]
    assert "static order (not measured: the tuning budget" in log.why()


def test_max_candidates_caps_the_timed_variants():
    timed = []
    ctx = cuda_ctx()
    cands = tuning.candidates(ctx)
    out = mx.zeros((2, 2))
    probe = SimpleNamespace(done=False, passes=lambda c, r: [(ctx, lambda route, kw: out)])

    def timer(label, fn):
        timed.append(label)
        return 1.0 if label != cands[-1].label else 0.1

    with tuning.using(mode="tune", max_candidates=3, timer=timer):
        sel = tuning._hook(ctx, routes.select(ctx), probe)[0]
    assert set(timed) == {c.label for c in cands[:3]} and len(cands) > 3
    assert sel.route.name == "cuda.sorted_mma" and sel.variant is None


def test_a_candidate_that_disagrees_is_left_out():
    ctx = cpu_ctx()
    cands = tuning.candidates(ctx)
    good, bad = mx.ones((8, 4)), mx.ones((8, 4)) * 1.5

    def run_(route, kw):
        return bad if route == "cpu.gather_gemm" else good

    with pytest.warns(RuntimeWarning, match="disagrees"):
        m = tuning.measure(ctx, run_, cands, FAST_GATHER)
    assert m.winner == cands[0] and "cpu.gather_gemm" in m.dropped

    def raising(route, kw):
        if route == "cpu.gather_gemm":
            raise RuntimeError("no")
        return good

    m = tuning.measure(ctx, raising, cands, FAST_GATHER)
    assert m.winner == cands[0] and "raised RuntimeError" in m.dropped["cpu.gather_gemm"]


def test_data_that_is_not_finite_is_not_measured():
    # NaN in the call's data (a diverged step): no reference to check the
    # candidates against, so the static route stands, unmeasured, and no
    # candidate is reported as disagreeing.
    ctx = cpu_ctx()
    cands = tuning.candidates(ctx)
    nan = mx.full((8, 4), float("nan"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = tuning.measure(ctx, lambda route, kw: nan, cands, FAST_GATHER)
    assert m.winner == cands[0] and not m.times_s and not m.dropped and "not finite" in m.note


def test_wall_timer_times_the_evaluation():
    a = mx.ones((256, 256))
    t = tuning.wall_timer("x", lambda: (a @ a).sum())
    assert 0 < t < 10


# ------------------------------------------------------------------ autodiff and determinism
def small_net(rng, c=16):
    coords = oracle.random_coords(rng, 400, 9, 2)
    x = ml.SparseTensor(coords, rng.standard_normal((len(coords), 4)).astype(np.float32))
    ws = [mx.array((rng.standard_normal(s) * 0.2).astype(np.float32))
          for s in [(c, 3, 3, 3, 4), (c, 2, 2, 2, c), (c, 3, 3, 3, c), (c, 2, 2, 2, c)]]

    def loss(feats, *ws):
        h = ops.subm_conv3d(x.replace(feats), ws[0])
        h = ops.conv3d(h, ws[1], stride=2)
        h = ops.subm_conv3d(h, ws[2])
        h = ops.conv_transpose3d(h, ws[3], stride=2)
        return (h.feats * h.feats).sum()

    return x, ws, mx.value_and_grad(loss, argnums=tuple(range(5)))


def test_backward_products_are_tuned_with_the_forward_call(rng, on_cpu):
    x, ws, f = small_net(rng)
    with tuning.using(mode="off"):
        static = f(x.feats, *ws)
    with tuning.using(mode="tune", timer=FAST_GATHER), diagnostics.record() as log:
        tuned = f(x.feats, *ws)
        mx.eval(tuned)
    recs = convs(log)
    multi = [r for r in recs if r["choice"] != "static" or r.get("tune_note")]
    assert {r["direction"] for r in multi} == {"forward", "dgrad"}
    # autodiff found every product decided: none went unmeasured for want of data
    assert not [r for r in recs if "no data" in (r.get("tune_note") or "")]
    assert all(r["choice"] == "tuner" and r["route"] == "cpu.gather_gemm" for r in multi)
    for a, b in zip(static[1], tuned[1]):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-5)


def test_results_fixed_by_the_cache(rng, on_cpu, cache_file):
    x, ws, f = small_net(rng)
    with tuning.using(mode="tune", timer=FAST_GATHER):
        mx.eval(f(x.feats, *ws))
    runs = []
    for _ in range(2):
        tuning.reset()  # a new process: everything from the cache file
        with tuning.using(mode="cached"), diagnostics.record() as log:
            out = f(x.feats, *ws)
            mx.eval(out)
        runs.append(([np.array(o) for o in [out[0], *out[1]]], [(r["direction"], r["route"]) for r in convs(log)]))
    (a, routes_a), (b, routes_b) = runs
    assert routes_a == routes_b and ("forward", "cpu.gather_gemm") in routes_a
    for u, v in zip(a, b):
        assert u.tobytes() == v.tobytes()


def test_why_and_record_fields(rng, on_cpu):
    x, w = strided(rng)
    with tuning.using(mode="tune", timer=FAST_GATHER), diagnostics.record() as log:
        run(x, w)
    why = log.why()
    assert "not cpu.row_gather: measured slower than cpu.gather_gemm: 1 ms vs 0.5 ms" in why
    assert "chosen by the route tuner, measured in this process: cpu.gather_gemm 0.5 ms, cpu.row_gather 1 ms" in why
    tuning.reset()
    with tuning.using(mode="cached"), diagnostics.record() as log:
        run(x, w)
    assert "chosen from the route tuning cache: cpu.gather_gemm 0.5 ms" in log.why()
    assert json.loads(log.to_json())[0]["choice"] == "cache"


# ------------------------------------------------------------------ CUDA, through stubs
def test_cuda_tuning_chooses_a_tile_shape_and_the_cache_keeps_it(cache_file):
    ctx = cuda_ctx()
    out = mx.ones((4, 4))
    ran = []

    def run_(route, kw):
        ran.append((route, tuple(sorted(kw.items()))))
        return out

    probe = SimpleNamespace(done=False, passes=lambda c, r: [(ctx, run_)])
    timer = costs({"cuda.sorted_mma[ak=32,bn=64]": 0.2, "cuda.sorted_mma": 1.0})
    with tuning.using(mode="tune", max_candidates=20, timer=timer), diagnostics.record() as log:
        sel = routes.choose(ctx, probe=probe)
    assert sel.route.name == "cuda.sorted_mma" and sel.variant == {"ak": 32, "bn": 64}
    assert log[0]["variant"] == {"ak": 32, "bn": 64} and log[0]["choice"] == "tuner"
    assert ("cuda.sorted_mma", (("ak", 32), ("bn", 64))) in ran
    [entry] = TuningCache(cache_file).load().values()
    assert entry["variant"] == {"ak": 32, "bn": 64} and entry["shape"]["backend"] == "cuda"
    tuning.reset()
    with tuning.using(mode="cached"):
        again = routes.choose(ctx)
    assert again.route.name == "cuda.sorted_mma" and again.variant == {"ak": 32, "bn": 64}


class _Plan:
    def __init__(self, rows, k):
        self.reorder_rows = mx.arange(rows)
        self.sorted_out_in_map = mx.zeros((rows, k), mx.int32)
        self.tile_masks = mx.zeros((-(-rows // 64),), mx.uint64)


def test_cuda_variants_reach_the_kernels(monkeypatch):
    from mlx_lattice.backends.cuda import BACKEND, kernels
    from mlx_lattice.backends.cuda import routes as table

    launched = []

    def fake_kernel(name, shared=0):
        def launch(**kw):
            launched.append((name, shared, dict(kw["template"]), kw["grid"]))
            return [mx.zeros(kw["output_shapes"][0], kw["output_dtypes"][0])]
        return launch

    monkeypatch.setattr(table, "_kernel", fake_kernel)
    x, w = mx.zeros((100, 64), mx.float16), mx.zeros((27, 64, 128), mx.float16)
    view = SimpleNamespace(rows=100, plan=lambda: _Plan(100, 27))
    table.sorted_mma(x, w, view)
    table.sorted_mma(x, w, view, bn=32, ak=16)
    (_, s0, t0, g0), (_, s1, t1, g1) = launched[-2:]
    # the default output tile fills the GPU: two row tiles, so 16 channels a block
    assert (t0["BN"], t0["AK"]) == (kernels.output_tile(128, 2), kernels.input_chunk(64)) == (16, 64)
    assert (t1["BN"], t1["AK"]) == (32, 16) and s1 == kernels.sorted_mma_shared_bytes(64, 128, 16, 32)
    assert g1[0] == 2 * (128 // 32) * 128  # two 64-row tiles, four 32-channel blocks each
    with pytest.raises(ValueError, match="BN=48"):
        table.sorted_mma(x, w, view, bn=48)
    # the row tile: 64 by default, 128 asked for (one 128-row tile, 256 threads)
    assert t0["TM"] == 64 and g0[0] == 2 * (128 // 16) * 128
    table.sorted_mma(x, w, view, tm=128)
    _, s2, t2, g2 = launched[-1]
    assert t2["TM"] == 128 and g2[0] == 1 * (128 // 16) * 256
    assert s2 == kernels.sorted_mma_shared_bytes(64, 128, bn=16, tm=128)
    with pytest.raises(ValueError, match="TM=32"):
        table.sorted_mma(x, w, view, tm=32)
    # channels that are no power of two: the output tile halves while it
    # stays a multiple of 16 (96 -> 48), the input chunk is all of them
    table.sorted_mma(mx.zeros((100, 48), mx.float16), mx.zeros((27, 48, 96), mx.float16), view)
    assert (launched[-1][2]["BN"], launched[-1][2]["AK"]) == (48, 48)
    assert [c.kwargs for c in tuning.candidates(cuda_ctx(c_in=48, c_out=96))[2:]] == [
        {"tm": 128}, {"bn": 96, "ak": 16}, {"bn": 48, "ak": 48}, {"bn": 48, "ak": 16}, {"bn": 32, "ak": 48},
        {"bn": 32, "ak": 16}, {"bn": 16, "ak": 48}, {"bn": 16, "ak": 16}]
    # the weight gradient's tiles and chunk
    chunks = []

    def wgrad_chunks(size):
        chunks.append(size)
        return mx.zeros((3, 3), mx.int32), mx.zeros((28,), mx.int32), SimpleNamespace(
            in_idx=mx.zeros((10,), mx.int32), out_idx=mx.zeros((10,), mx.int32))

    wview = SimpleNamespace(rel=SimpleNamespace(edges=10), wgrad_chunks=wgrad_chunks)
    table.wgrad_mma(x, mx.zeros((100, 128), mx.float16), wview, 27, ta=32, tb=64, chunk=128)
    assert chunks[-1] == 128
    assert [(t["TA"], t["TB"]) for n, _, t, _ in launched if n == "wgrad_mma"][-1] == (32, 64)
    # through the backend's launch, as the tuner and the backward pass call it
    seen = []
    monkeypatch.setitem(table.ROUTES, "cuda.sorted_mma",
                        table.Route("conv", lambda *a, **kw: seen.append(kw) or mx.zeros((1,))))
    BACKEND.launch("cuda.sorted_mma", "conv", x, w, view, variant={"bn": 64})
    BACKEND.launch("cuda.sorted_mma", "conv", x, w, view)
    assert seen == [{"bn": 64}, {}]


def test_ops_pass_a_cached_variant_to_the_cuda_route(rng, monkeypatch, cache_file):
    from mlx_lattice.backends import cuda

    coords = oracle.random_coords(rng, 200, 7, 1)
    x = ml.SparseTensor(coords, mx.zeros((len(coords), 64), mx.float16))
    w = mx.zeros((64, 3, 3, 3, 64), mx.float16)
    calls = []
    from mlx_lattice import backends

    monkeypatch.setattr(backends, "current", lambda stream=None: cuda.BACKEND)
    monkeypatch.setattr(cuda.BACKEND, "product_view", lambda rel: None)
    monkeypatch.setattr(cuda.BACKEND, "launch", lambda route, op, f, wm, view, k=1, groups=1, variant=None:
                        calls.append((route, variant)) or mx.zeros((len(coords), 64), mx.float16))
    with tuning.using(mode="off"), diagnostics.record() as log:
        ops.subm_conv3d(x, w)
    ctx = RouteContext(**{k: log[-1][k] for k in routes._CONTEXT_FIELDS})
    key = tuning._key_info(ctx, routes.select(ctx).route)[0]
    TuningCache(cache_file).merge({key: {"route": "cuda.sorted_mma", "variant": {"bn": 32, "ak": 64}}})
    with tuning.using(mode="cached"):
        ops.subm_conv3d(x, w)
    assert calls == [("cuda.sorted_mma", None), ("cuda.sorted_mma", {"bn": 32, "ak": 64})]


# ------------------------------------------------------------------ the tune command and the bench
def test_tune_command_and_step_comparison(rng, on_cpu, cache_file, capsys):
    from mlx_lattice import scenes
    from mlx_lattice.__main__ import main
    from mlx_lattice.bench import tuner

    coords = scenes.uniform_random(3000, 20)
    decisions, spent, total = tuner.tune_model(coords, width=0.25, budget_s=30)
    assert decisions and 0 < spent <= total
    assert all(d.source == "tuner" and d.timings_ms for d in decisions if d.source != "static")
    entries = TuningCache(cache_file).load()
    assert len(entries) == len([d for d in decisions if d.source == "tuner"]) > 0
    assert main(["tune", "--show"]) == 0
    out = capsys.readouterr().out
    assert f"{cache_file}: {len(entries)} entries" in out and "cpu.row_gather" in out
    res = tuner.compare_steps(coords, width=0.25, repeats=1, budget_s=30)
    assert res["static_ms"] > 0 and res["tuned_ms"] > 0 and res["decisions"]
    text = tuner.format_comparison(res, "tiny step")
    assert "static order best" in text and "tuned best" in text and res["paired_ratio_median"] > 0
    # the comparison tuned into a temporary cache, not the user's
    assert len(TuningCache(cache_file).load()) == len(entries)
    assert main(["tune", "--clear"]) == 0
    assert TuningCache(cache_file).load() == {}
