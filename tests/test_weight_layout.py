"""Weight layouts of the CPU gather-GEMM and weight gradient.

The CPU primitive packs its weight panels through the weight's strides, so
the (C_out, Kx, Ky, Kz, C_in) parameter's transposed view is read in place
(no copy to kernel-major), and the weight gradient is written in the
parameter's own order. Packing only copies values: every layout gives the
bitwise result of the contiguous (K, C_in, C_out) weight, on every path.
"""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import _ext, autodiff, backends, ops
from mlx_lattice.ops import mapped_weight
from mlx_lattice.relation import KernelGeometry

import oracle
from conftest import TOLERANCES, to_np

CPU = mx.default_stream(mx.cpu)


@pytest.fixture(autouse=True)
def cpu_device(on_cpu):
    yield


def _bytes(a):
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a).tobytes()


def _case(rng, c_in, c_out, dtype, n=300, extent=8):
    coords = oracle.random_coords(rng, n, extent, 2)
    x = ml.SparseTensor(coords, mx.zeros((len(coords), 1)))
    geom = KernelGeometry((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    rel = x.manager.submanifold_kernel_relation(x.coordinate_set, geom)
    feats = mx.array(rng.standard_normal((len(coords), c_in)).astype(np.float32)).astype(dtype)
    w5 = mx.array((rng.standard_normal((c_out, 3, 3, 3, c_in)) / np.sqrt(27 * c_in)).astype(np.float32))
    edges = oracle.conv_edges(coords, coords, 3, 1, 1)
    return rel, feats, w5.astype(dtype), edges


def _layouts(w5):
    """The same (K, C_in, C_out) values in several memory layouts."""
    c_out, kx, ky, kz, c_in = w5.shape
    view = mapped_weight(w5)  # the parameter read in place: strides (C_in, 1, K * C_in)
    # (K, C_out, C_in) storage read through swapaxes: contiguous along C_in
    kco = mx.contiguous(w5.reshape(c_out, -1, c_in).transpose(1, 0, 2)).swapaxes(1, 2)
    # every other row of a twice-as-wide array: C_out strided by 2
    wide = mx.repeat(mx.contiguous(view), 2, axis=2)[:, :, ::2]
    return {"contiguous": mx.contiguous(view), "parameter": view, "k_cout_cin": kco, "strided": wide}


@pytest.mark.parametrize("c_in,c_out,dtype", [
    (5, 7, mx.float32), (32, 32, mx.float32), (24, 40, mx.float16), (17, 33, mx.bfloat16),
    (64, 20, mx.float32),
])
def test_forward_reads_any_weight_layout(rng, isa, c_in, c_out, dtype):
    rel, feats, w5, edges = _case(rng, c_in, c_out, dtype)
    outs = {}
    for name, w in _layouts(w5).items():
        y = _ext.gather_conv(feats, w, rel._native, _ext.View.output_major, "cpu.gather_gemm", CPU)
        mx.eval(y)
        outs[name] = _bytes(y)
    assert all(v == outs["contiguous"] for v in outs.values()), [k for k, v in outs.items() if v != outs["contiguous"]]
    expected = oracle.apply(edges, to_np(feats), to_np(w5), feats.shape[0])
    tol = TOLERANCES[dtype]
    np.testing.assert_allclose(to_np(y), expected, **tol)


@pytest.mark.parametrize("c_in,c_out,dtype", [(3, 9, mx.float32), (32, 64, mx.float32), (24, 40, mx.float16)])
def test_input_gradient_reads_transposed_view(rng, isa, c_in, c_out, dtype):
    rel, feats, w5, edges = _case(rng, c_in, c_out, dtype)
    ct = mx.array(rng.standard_normal((feats.shape[0], c_out)).astype(np.float32)).astype(dtype)
    dx = {}
    for name in ("contiguous", "parameter"):
        w = _layouts(w5)[name]
        view = backends.CPU.product_view(rel)
        fn = lambda f: autodiff.conv(backends.CPU, "cpu.gather_gemm", f, w, view)  # noqa: E731
        _, (g,) = mx.vjp(fn, [feats], [ct])
        mx.eval(g)
        dx[name] = g
    assert _bytes(dx["parameter"]) == _bytes(dx["contiguous"])
    e_dx, _, _ = oracle.grads(edges, to_np(feats), to_np(w5), to_np(ct))
    np.testing.assert_allclose(to_np(dx["parameter"]), e_dx, **TOLERANCES[dtype])


@pytest.mark.parametrize("c_in,c_out,dtype", [(1, 3, mx.float32), (32, 32, mx.float32), (17, 40, mx.bfloat16)])
def test_weight_gradient_in_parameter_order(rng, isa, c_in, c_out, dtype):
    rel, feats, w5, edges = _case(rng, c_in, c_out, dtype)
    ct = mx.array(rng.standard_normal((feats.shape[0], c_out)).astype(np.float32)).astype(dtype)
    dw = _ext.weight_grad(feats, ct, rel._native, _ext.View.output_major, 27, "cpu.wgrad_gemm", CPU)
    # read as (K, C_in, C_out), and through the parameter's layout
    dw5 = dw.transpose(2, 0, 1).reshape(c_out, 3, 3, 3, c_in)
    mx.eval(dw, dw5)
    _, e_dw, _ = oracle.grads(edges, to_np(feats), to_np(w5), to_np(ct))
    tol = TOLERANCES[dtype]
    atol = tol["atol"] * max(1.0, np.abs(e_dw).max())
    np.testing.assert_allclose(to_np(dw5), e_dw, rtol=tol["rtol"], atol=atol)
    np.testing.assert_allclose(to_np(dw), oracle.mapped(e_dw).transpose(0, 2, 1), rtol=tol["rtol"], atol=atol)
    # consumers of either reading see the same values as a contiguous copy
    assert _bytes(mx.contiguous(dw5)) == _bytes(dw5)
    assert np.array_equal(np.array(mx.contiguous(dw).astype(mx.float32)), np.array(dw.astype(mx.float32)))


def test_parameter_gradient_through_ops(rng, isa):
    coords = oracle.random_coords(rng, 400, 8, 2)
    feats = mx.array(rng.standard_normal((len(coords), 24)).astype(np.float32))
    w5 = mx.array(rng.standard_normal((40, 3, 3, 3, 24)).astype(np.float32) / 15)
    ct = mx.array(rng.standard_normal((len(coords), 40)).astype(np.float32))
    x = ml.SparseTensor(coords, feats)
    _, (dx, dw) = mx.vjp(lambda f, w: ops.subm_conv3d(x.replace(f), w).feats, [feats, w5], [ct])
    # an elementwise consumer (as an optimizer's update) of the gradient
    step = w5 - 0.1 * dw
    mx.eval(dx, dw, step)
    edges = oracle.conv_edges(coords, coords, 3, 1, 1)
    e_dx, e_dw, _ = oracle.grads(edges, to_np(feats), to_np(w5), to_np(ct))
    np.testing.assert_allclose(np.array(dx), e_dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.array(dw), e_dw, rtol=1e-4, atol=1e-4 * np.abs(e_dw).max())
    np.testing.assert_allclose(np.array(step), to_np(w5) - 0.1 * e_dw, rtol=1e-4, atol=1e-4 * np.abs(e_dw).max())


@pytest.mark.parametrize("c_out", [16, 32, 64])
def test_rows_without_edges_are_zero(rng, isa, c_out):
    # Float32 outputs of whole vectors with few edges per row are written in
    # place: target rows no input reaches must come out zero even in a
    # reused (dirty) buffer.
    coords = oracle.random_coords(rng, 200, 8, 2)
    far = coords[:50].copy()
    far[:, 1:] += 100
    target = np.concatenate([coords[::3], far])
    feats = mx.array(rng.standard_normal((len(coords), 8)).astype(np.float32))
    w5 = mx.array(rng.standard_normal((c_out, 2, 2, 2, 8)).astype(np.float32))
    x = ml.SparseTensor(coords, feats)
    for _ in range(3):
        mx.eval(mx.full((len(target), c_out), 7.0) * 3)  # leave dirty buffers behind
        y = ops.conv3d(x, w5, coordinates=target).feats
        mx.eval(y)
        edges = oracle.conv_edges(coords, target, 2)
        expected = oracle.apply(edges, np.array(feats), np.array(w5), len(target))
        np.testing.assert_allclose(np.array(y), expected, rtol=1e-5, atol=1e-5)
        assert not np.array(y)[-50:].any()


class _FlipReading(type(backends.CPU)):
    """The CPU backend, announcing that its routes read flipped weights in
    place (as the CUDA routes do) and making them here from w, so that
    autodiff's flip bookkeeping runs on every machine. Its launch makes the
    flipped copies in Python, so its products are wrapped in custom
    functions (as CUDA's are) rather than differentiating themselves."""

    differentiable_products = False

    def __init__(self):
        super().__init__()
        self.flips = []

    def reads_flipped(self, route):
        return True

    def launch(self, route, op, a, b, view, k=1, groups=1, variant=None, flip=autodiff.NO_FLIP):
        self.flips.append(tuple(flip))
        return super().launch(route, op, a, autodiff.flipped_weight(b, flip, groups), view, k, groups, variant)


@pytest.mark.parametrize("stride", [1, 2])
def test_flipped_weight_reads_match_transposed_copies(rng, stride):
    """Gradients of first and second order through products that read the
    weight flipped in place equal those through the flipped copies (a
    symmetric relation: transposed and mirrored; a strided one: transposed)."""
    coords = oracle.random_coords(rng, 200, 7, 2)
    x = ml.SparseTensor(coords, mx.array(rng.standard_normal((len(coords), 5)).astype(np.float32)))
    w = mx.array(rng.standard_normal((6, 3, 3, 3, 5)).astype(np.float32) / 5)
    y = ops.conv3d(x, w, stride=stride, padding=1) if stride > 1 else ops.subm_conv3d(x, w)
    wk = mapped_weight(w)
    ct = mx.array(rng.standard_normal(y.feats.shape).astype(np.float32))
    rels = [r for r, _ in x.manager._relations.values() if r is not None]
    assert len(rels) == 1
    results = {}
    for name, backend in (("flipped view", backends.CPU), ("copies", backends.CPU), ("in place", _FlipReading())):
        # A centred odd kernel at stride 1 is symmetric (the CPU builder does
        # not mark it; the CUDA builder does): its input gradient then reads
        # the same view with W mirrored, else the flipped view.
        rels[0].symmetric = stride == 1 and name != "flipped view"
        view = backend.product_view(rels[0])

        def dx_of(f, w):
            return mx.vjp(lambda f: autodiff.conv(backend, "cpu.gather_gemm", f, w, view), [f], [ct])[1][0]

        dx = dx_of(x.feats, wk)
        # second order: the input gradient's own gradients (its product's VJP)
        g2 = mx.grad(lambda f, w: (dx_of(f, w) ** 2).sum(), argnums=(0, 1))(x.feats, wk)
        _, jv = mx.jvp(lambda w: dx_of(x.feats, w), [wk], [wk * 0.5])
        mx.eval(dx, g2, jv)
        results[name] = (dx, *g2, jv[0])
        if name == "in place":
            want = (True, rels[0].symmetric)
            assert want in backend.flips, backend.flips
    assert [_bytes(a) for a in results["in place"]] == [_bytes(a) for a in results["copies"]]
    for a, b in zip(results["copies"], results["flipped view"]):
        np.testing.assert_allclose(to_np(a), to_np(b), rtol=1e-4, atol=1e-4 * float(mx.abs(b).max()))
