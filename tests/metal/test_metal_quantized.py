"""Metal quantized routes (QuantizedWeight): selection by predicate, and each
route's program run through the CPU harness, compared with the float route
on the dequantized weight and with the oracle on the dequantized weight;
float32, float16 and bfloat16 features on the direct packed route."""

import numpy as np
import pytest
import mlx.core as mx

from mlx_lattice import QuantizedWeight, routes
from mlx_lattice.layout import mapped_weight
from mlx_lattice.routes import RouteContext

import oracle
import metal_programs
from conftest import METAL_TOLERANCES

# bfloat16: float sums, one rounding to the dtype (2^-8) on each side.
TOL = {**METAL_TOLERANCES, mx.bfloat16: dict(rtol=2.0**-7, atol=1e-3)}

pytestmark = metal_programs.MARKS

SCHEDULES = ("forward", "reverse", "random")


def qctx(**kw):
    base = dict(op="conv3d", map_kind="submanifold", dtype="float16", backend="metal",
                kernel_size=(3, 3, 3), tier="metal:test", quantized=True, weight_layout="packed",
                c_in=32, c_out=32, group_size=32, n_in=1000, n_out=1000)
    base.update(kw)
    return RouteContext(**base)




def case(rng, n, c_in, c_out, dtype, kind="submanifold", bits=4, group=32):
    """metal_programs.case with the weight quantized (and a target with no
    edge): features, QuantizedWeight, relation, oracle edges, output count."""
    feats, w5, rel, edges, n_out = metal_programs.case(
        rng, n, c_in, c_out, dtype, kind, unreachable_target=True, weight_dtype=mx.float32)
    return feats, QuantizedWeight.from_float(w5, bits=bits, group_size=group), rel, edges, n_out


def check(route, feats, q, rel, edges, n_out, dtype, schedule="forward"):
    """Quantized route vs the float route and the oracle, both on the dequantized weight."""
    y = metal_programs.quantized(route, feats, q, rel._native, schedule=schedule,
                                 record={"op": "conv3d", "map_kind": rel.kind, "quantized": True})
    assert not np.isnan(y).any()
    deq = q.dequantize()  # float32 5D
    expected = oracle.apply(edges, np.array(feats.astype(mx.float32)), np.array(deq), n_out)
    y64 = y.astype(np.float64)
    np.testing.assert_allclose(y64, expected, **TOL[dtype])
    # the scalar float route where it has the dtype, the matrix-unit one for
    # bfloat16, whose weight rounded to bfloat16 (2^-9) the quantized route
    # never rounds: a wider tolerance there
    float_route = "metal.csr_mma" if dtype == mx.bfloat16 else "metal.fetch_on_demand"
    yf = metal_programs.conv(float_route, feats, mapped_weight(deq.astype(dtype)), rel._native)
    tol = dict(rtol=2e-2, atol=1e-2) if dtype == mx.bfloat16 else TOL[dtype]
    np.testing.assert_allclose(y64, yf.astype(np.float64), **tol)
    return float(np.max(np.abs(y64 - expected)))


# ------------------------------------------------------------------ selection
@pytest.mark.parametrize(
    "kw,route",
    [
        (dict(), "metal.sorted_quantized"),
        (dict(c_in=64, c_out=32, group_size=64, map_kind="target"), "metal.sorted_quantized"),
        (dict(c_in=64, c_out=64, group_size=32, map_kind="forward"), "metal.sorted_quantized"),
        (dict(c_in=64, c_out=64, group_size=32, tensor_ops=True), "metal.sorted_quantized"),
        (dict(c_in=32, c_out=64, group_size=32, tensor_ops=True), "metal.tensorops_quantized"),
        (dict(c_in=64, c_out=64, group_size=64, tensor_ops=True), "metal.tensorops_quantized"),
        (dict(c_in=32, c_out=32, group_size=64), "metal.quantized_fetch_on_demand"),  # group > C_in
        (dict(c_in=32, c_out=32, group_size=64, tensor_ops=True), "metal.quantized_fetch_on_demand"),
        (dict(dtype="float32"), "metal.quantized_fetch_on_demand"),
        (dict(kernel_size=(2, 2, 2)), "metal.quantized_fetch_on_demand"),
        (dict(map_kind="transposed"), "metal.quantized_fetch_on_demand"),
        (dict(c_in=128, c_out=32, group_size=32), "metal.quantized_fetch_on_demand"),
        (dict(c_in=32, c_out=16), "metal.quantized_fetch_on_demand"),
        (dict(tier="metal:unknown:macos-unknown:tensorops=no"), "metal.quantized_fetch_on_demand"),
        (dict(dtype="float32", c_in=7, c_out=5), "metal.quantized_fetch_on_demand"),
    ],
)
def test_quantized_selection(kw, route):
    sel = routes.select(qctx(**kw))
    assert sel.route.name == route and sel.fallback is None


def test_quantized_selection_other_backends():
    assert routes.select(qctx(backend="cpu", tier="cpu")).route.name == "cpu.quantized_gather_gemm"
    # bfloat16 features: the direct packed route on the GPU (the CPU before)
    sel = routes.select(qctx(dtype="bfloat16"))
    assert sel.route.name == "metal.quantized_fetch_on_demand" and sel.fallback is None
    # float routes never take a quantized call and vice versa
    assert routes.select(qctx(quantized=False, weight_layout="dense5d")).route.name == "metal.sorted_gemm"


# ------------------------------------------------------------------ execution
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("kind", ["submanifold", "forward", "target", "pointwise"])
def test_quantized_fetch_on_demand(rng, bits, dtype, kind):
    c_in, c_out, group = (64, 7, 32) if bits == 4 else (128, 33, 64)
    feats, q, rel, edges, n_out = case(rng, 90, c_in, c_out, dtype, kind, bits, group)
    ctx = qctx(map_kind=rel.kind, dtype=str(dtype).replace("mlx.core.", ""), c_in=c_in, c_out=c_out,
               group_size=group, kernel_size=(1, 1, 1) if kind == "pointwise" else (3, 3, 3))
    assert routes.select(ctx).route.name == "metal.quantized_fetch_on_demand"
    check("metal.quantized_fetch_on_demand", feats, q, rel, edges, n_out, dtype, SCHEDULES[bits % 3])


def test_quantized_fetch_on_demand_without_relation(rng):
    """Pointwise product (no relation): row r reads row r at offset 0."""
    feats = mx.array(rng.standard_normal((50, 32)).astype(np.float32))
    q = QuantizedWeight.from_float(mx.array(rng.standard_normal((9, 1, 1, 1, 32)).astype(np.float32)), 8, 32)
    y = metal_programs.quantized("metal.quantized_fetch_on_demand", feats, q, None)
    expected = np.array(feats) @ np.array(q.dequantize())[:, 0, 0, 0, :].T
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("c_in,c_out", [(32, 32), (32, 64), (64, 32), (64, 64)])
def test_sorted_quantized(rng, bits, c_in, c_out):
    kind = ("submanifold", "forward", "target")[(c_in // 32 + c_out // 32 + bits) % 3]
    group = 64 if (c_in == 64 and bits == 8) else 32
    feats, q, rel, edges, n_out = case(rng, 260, c_in, c_out, mx.float16, kind, bits, group)
    ctx = qctx(map_kind=rel.kind, c_in=c_in, c_out=c_out, group_size=group)
    assert routes.select(ctx).route.name == "metal.sorted_quantized"
    assert rel.n_out % 64 != 0
    check("metal.sorted_quantized", feats, q, rel, edges, n_out, mx.float16, SCHEDULES[(bits // 4 + c_in // 64) % 3])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("c_in,c_out", [(32, 32), (32, 64), (64, 32), (64, 64)])
def test_tensorops_quantized(rng, bits, c_in, c_out):
    kind = ("target", "submanifold", "forward")[(c_in // 32 + c_out // 32 + bits) % 3]
    feats, q, rel, edges, n_out = case(rng, 260, c_in, c_out, mx.float16, kind, bits, c_in)
    ctx = qctx(map_kind=rel.kind, c_in=c_in, c_out=c_out, group_size=c_in, tensor_ops=True)
    assert routes.select(ctx).route.name == "metal.tensorops_quantized"
    schedule = SCHEDULES[(bits // 4 + c_out // 32) % 3]
    check("metal.tensorops_quantized", feats, q, rel, edges, n_out, mx.float16, schedule)
    # and equal (to fp16 rounding) to the sorted quantized route
    y0 = metal_programs.quantized("metal.sorted_quantized", feats, q, rel._native)
    y1 = metal_programs.quantized("metal.tensorops_quantized", feats, q, rel._native)
    np.testing.assert_allclose(y0.astype(np.float64), y1.astype(np.float64), rtol=1e-2, atol=1e-2)


def test_quantized_programs_refuse_other_shapes(rng):
    feats, q, rel, edges, n_out = case(rng, 60, 64, 32, mx.float16, bits=4, group=32)
    with pytest.raises(ValueError, match="group_size == C_in"):
        metal_programs.quantized("metal.tensorops_quantized", feats, q, rel._native)
    f32 = feats.astype(mx.float32)
    with pytest.raises(ValueError, match="float16"):
        metal_programs.quantized("metal.sorted_quantized", f32, q, rel._native)
