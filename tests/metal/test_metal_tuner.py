"""The route tuner on the Metal routes: the candidates of a Metal call, its
keys, and the choice for each pass, with every candidate's program run on
the call's own data through the harness (on a Mac: on the GPU) and the
timing replaced by a deterministic stub. On a Mac, mode ``tune`` runs the
same logic with the wall-clock timer."""

import numpy as np
import pytest
import mlx.core as mx

from mlx_lattice import autodiff, backends, diagnostics, routes, tuning, tuning_cache
from mlx_lattice.layout import mapped_weight
from mlx_lattice.tuning_cache import TuningCache

import oracle
import metal_programs
from conftest import METAL_TOLERANCES as TOL

pytestmark = metal_programs.MARKS

# Seconds per route: the stub makes the static choice lose to the
# fetch-on-demand routes.
COST = {"metal.fetch_on_demand": 1e-3, "metal.wgrad_direct": 1e-3}


def stub_timer(label, fn):
    return COST.get(label.split("[")[0], 5e-3)


def harness(backend, route, op, a, b, view, k=1, groups=1, variant=None):
    """Runs a product through the route's Metal program (tuning.CallProbe's
    ``execute``): the harness on Linux, the GPU on a Mac."""
    assert backend.name == "metal" and not variant
    if op == "conv":
        return metal_programs.conv(route, a, b, view.native, view.major, groups=groups)
    assert op == "weight_grad", op
    return metal_programs.weight_grad(route, a, b, view.native, k, view.major, groups=groups)


@pytest.fixture(autouse=True)
def fresh_tuner(tmp_path):
    state = tuning._state
    saved = (tuning.settings(), dict(state.forced), state.timer)
    tuning.reset()
    tuning_cache._warned.clear()
    yield tmp_path / "tuning.json"
    tuning.reset()
    state.settings, state.forced, state.timer = saved


def metal_call(rel, dtype, c_in, c_out):
    return routes.context(
        "subm_conv3d", "metal", map_kind=rel.kind, dtype=dtype, kernel_size=(3, 3, 3), padding=(1, 1, 1),
        c_in=c_in, c_out=c_out, n_in=rel.n_in, n_out=rel.n_out, edges=rel.edges,
    )


def test_metal_passes_tuned_through_the_harness(rng, fresh_tuner):
    feats, w5, rel, edges, n_out = metal_programs.case(rng, 300, 32, 32, mx.float16)
    ctx = metal_call(rel, "float16", 32, 32)
    static = routes.select(ctx).route.name
    cands = tuning.candidates(ctx)
    assert cands[0].route == static != "metal.fetch_on_demand"
    assert {"metal.fp16_gather", "metal.fetch_on_demand"} <= {c.route for c in cands}
    probe = tuning.CallProbe(feats, w5, rel, execute=harness)
    with tuning.using(mode="tune", cache_path=str(fresh_tuner), timer=stub_timer, max_candidates=16), \
            diagnostics.record() as log:
        sel = routes.choose(ctx, probe=probe)
    assert sel.route.name == "metal.fetch_on_demand" and sel.route.failed(ctx) is None
    rec = [r for r in log if "choice" in r][-1]
    assert rec["choice"] == "tuner" and rec["backend"] == "metal" and rec["route"] == "metal.fetch_on_demand"
    timed = set(rec["timings_ms"])
    assert {static, "metal.fetch_on_demand", "metal.fp16_gather"} <= timed <= {c.label for c in cands}
    # every candidate of every pass ran its program on the call's data
    ran = {r["route"] for r in log if r.get("backend") in ("metal-harness", "metal")}
    assert {c.route for c in cands} <= ran

    by_pass = {d.shape["pass"]: d for d in tuning.decisions()}
    assert set(by_pass) == {"forward", "dgrad", "wgrad"}
    assert all(d.shape["backend"] == "metal" and d.source == "tuner" for d in by_pass.values())
    assert by_pass["dgrad"].route == "metal.fetch_on_demand" and by_pass["wgrad"].route == "metal.wgrad_direct"
    assert len(TuningCache(fresh_tuner).load()) == 3

    # the chosen program gives the oracle's output
    y = metal_programs.conv(sel.route.name, feats, mapped_weight(w5), rel._native)
    expected = oracle.apply(edges, np.array(feats.astype(mx.float32)), np.array(w5.astype(mx.float32)), n_out)
    np.testing.assert_allclose(y.astype(np.float64), expected, **TOL[mx.float16])

    # autodiff's queries on a Mac make the same keys: its products find the
    # choices, in this process and, from the cache, in the next
    view = backends.get("metal").product_view(rel)
    dctx = autodiff.context("metal", "dgrad", view.flipped(), 27, 32, 32, rel.n_out, "float16", static)
    wctx = autodiff.context("metal", "wgrad", view, 27, 32, 32, rel.n_in, "float16", static)
    with tuning.using(mode="tune", cache_path=str(fresh_tuner)):
        assert routes.choose(dctx).route.name == "metal.fetch_on_demand"
    tuning.reset()
    with tuning.using(mode="cached", cache_path=str(fresh_tuner)), diagnostics.record() as log:
        assert routes.choose(wctx).route.name == "metal.wgrad_direct"
        assert routes.choose(ctx).route.name == "metal.fetch_on_demand"
    assert [r["choice"] for r in log] == ["cache", "cache"]
    with tuning.using(mode="off"):
        assert routes.choose(ctx).route.name == static


def test_metal_candidate_with_wrong_output_is_never_chosen(rng, fresh_tuner):
    feats, w5, rel, edges, n_out = metal_programs.case(rng, 200, 32, 32, mx.float16)
    ctx = metal_call(rel, "float16", 32, 32)

    def broken(backend, route, op, a, b, view, k=1, groups=1, variant=None):
        y = harness(backend, route, op, a, b, view, k, groups, variant)
        return y * 2 if route == "metal.fetch_on_demand" else y

    probe = tuning.CallProbe(feats, w5, rel, execute=broken)
    with pytest.warns(RuntimeWarning, match="disagrees"):
        with tuning.using(mode="tune", cache_path=str(fresh_tuner), timer=stub_timer, max_candidates=16):
            sel = routes.choose(ctx, probe=probe)
    assert sel.route.name != "metal.fetch_on_demand"
    forward = [d for d in tuning.decisions() if d.shape["pass"] == "forward"][0]
    assert "metal.fetch_on_demand" not in (forward.timings_ms or {})
    entry = TuningCache(fresh_tuner).load()[forward.key]
    assert "metal.fetch_on_demand" in entry["dropped"]
