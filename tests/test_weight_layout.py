"""Weight layouts of the CPU gather-GEMM and weight gradient.

The CPU primitive packs its weight panels through the weight's strides, so
the (C_out, Kx, Ky, Kz, C_in) parameter's transposed view is read in place
(no copy to kernel-major), and the weight gradient is written in the
parameter's own order. Packing only copies values: every layout gives the
bitwise result of the contiguous (K, C_in, C_out) weight, on every path.
"""

from types import SimpleNamespace

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import _ext, autodiff, backends, layout, ops
from mlx_lattice.backends.native import NativeView
from mlx_lattice.layout import mapped_weight
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
    for name, backend in (("flipped view", backends.CPU), ("in place", backends.CPU), ("copies", _FlipReading())):
        # A centred odd kernel at stride 1 is symmetric (every builder marks
        # it): its input gradient then reads the same view with W mirrored,
        # else the flipped view.
        assert rels[0].symmetric == (stride == 1)
        view = backend.product_view(rels[0])
        if name == "flipped view" and stride == 1:
            # the same edges built as any relation (onto a copy of the rows):
            # the input gradient over the flipped view
            plain = _ext.build_relation(_ext.CoordTable(mx.array(coords)), mx.array(coords), (3, 3, 3),
                                        (1, 1, 1), (1, 1, 1), (1, 1, 1), False, "submanifold")
            assert not plain.symmetric
            view = NativeView(plain)

        def dx_of(f, w):
            return mx.vjp(lambda f: autodiff.conv(backend, "cpu.gather_gemm", f, w, view), [f], [ct])[1][0]

        dx = dx_of(x.feats, wk)
        # second order: the input gradient's own gradients (its product's VJP)
        g2 = mx.grad(lambda f, w: (dx_of(f, w) ** 2).sum(), argnums=(0, 1))(x.feats, wk)
        _, jv = mx.jvp(lambda w: dx_of(x.feats, w), [wk], [wk * 0.5])
        mx.eval(dx, g2, jv)
        results[name] = (dx, *g2, jv[0])
        if name == "copies":
            want = (True, rels[0].symmetric)
            assert want in backend.flips, backend.flips
    got = {name: [_bytes(a) for a in r] for name, r in results.items()}
    # The CPU reads a relation it built symmetric, mirrored, as its other
    # view (the same edges summed in the weight's order): the flipped view's
    # bits. The copies over the same view sum the offsets the other way.
    assert got["in place"] == got["flipped view"]
    if stride > 1:
        assert got["copies"] == got["in place"]
    for a, b in zip(results["copies"], results["flipped view"]):
        np.testing.assert_allclose(to_np(a), to_np(b), rtol=1e-4, atol=1e-4 * float(mx.abs(b).max()))


@pytest.mark.parametrize("groups", [1, 2])
def test_symmetric_input_gradient_bits(rng, groups):
    """On a symmetric relation the CPU's input gradient (the same view, W
    mirrored: an ungrouped product reads it in place, a grouped one its
    transposed copy mirrored in place) has the bits of the input gradient
    over the flipped view of the same edges built as any relation, and the
    oracle's values."""
    coords = oracle.random_coords(rng, 250, 7, 2)
    geom = KernelGeometry((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    x = ml.SparseTensor(coords, mx.zeros((len(coords), 1)))
    rel = x.manager.submanifold_kernel_relation(x.coordinate_set, geom)
    assert rel.symmetric and rel._native.symmetric
    plain = _ext.build_relation(_ext.CoordTable(mx.array(coords)), mx.array(coords), *geom.args(), False,
                                "submanifold")
    assert not plain.symmetric
    route = "cpu.gather_gemm" if groups == 1 else "cpu.grouped_gather"
    c_in, c_out = 4, 6
    w = mx.array(rng.standard_normal((27, c_in // groups, c_out)).astype(np.float32) / 5)
    feats = mx.array(rng.standard_normal((len(coords), c_in)).astype(np.float32))
    ct = mx.array(rng.standard_normal((len(coords), c_out)).astype(np.float32))
    view = backends.CPU.product_view(rel)
    assert view.symmetric
    dx = mx.vjp(lambda f: autodiff.conv(backends.CPU, route, f, w, view, groups), [feats], [ct])[1][0]
    want = _ext.gather_conv(ct, autodiff.flipped_weight(w, (True, False), groups), plain, _ext.View.input_major,
                            route, CPU, groups=groups)
    mx.eval(dx, want)
    assert _bytes(dx) == _bytes(want)
    # dense block-diagonal weight: group g's outputs read its inputs only
    a, b = c_in // groups, c_out // groups
    full = np.zeros((27, c_in, c_out))
    for g in range(groups):
        full[:, g * a:(g + 1) * a, g * b:(g + 1) * b] = np.array(w)[:, :, g * b:(g + 1) * b]
    ref = np.zeros((len(coords), c_in))
    g_ct = np.array(ct, np.float64)
    for o, i, k in oracle.conv_edges(coords, coords, 3, padding=1):
        ref[i] += full[k] @ g_ct[o]
    np.testing.assert_allclose(np.array(dx), ref, rtol=1e-4, atol=1e-4)


def _grads(backend, route, feats, w, view, ct, groups=1):
    """Forward, dx, dw, a second-order gradient and a JVP of one product."""
    def f(a, b):
        return autodiff.conv(backend, route, a, b, view, groups)

    y = f(feats, w)
    dx, dw = mx.vjp(f, [feats, w], [ct])[1]
    g2x, g2w = mx.grad(lambda a, b: (mx.vjp(lambda a: f(a, b), [a], [ct])[1][0] ** 2).sum(),
                       argnums=(0, 1))(feats, w)
    jv = mx.jvp(f, [feats, w], [feats * 0.5, w * 0.25])[1][0]
    mx.eval(y, dx, dw, g2x, g2w, jv)
    return y, dx, dw, g2x, g2w, jv


@pytest.mark.parametrize("shape,route,groups", [
    ((7, 3, 3, 3, 5), "cpu.gather_gemm", 1),
    ((7, 3, 3, 3, 5), "cpu.row_gather", 1),
    ((8, 3, 3, 3, 2), "cpu.grouped_gather", 2),
    ((6, 1, 1, 1, 5), "cpu.pointwise", 1),
    ((6, 5), "cpu.pointwise", 1),
])
def test_parameter_layout_matches_kernel_major(rng, shape, route, groups):
    """A product given the parameter itself (read in place; its gradient
    written in its layout, a grouped one copied into it) gives the bits of
    the same product given the kernel-major weight, through first- and
    second-order gradients and a JVP; the oracle checks the values."""
    coords = oracle.random_coords(rng, 250, 7, 2)
    c_out, c_in = shape[0], shape[-1] * groups
    feats = mx.array(rng.standard_normal((len(coords), c_in)).astype(np.float32))
    w = mx.array(rng.standard_normal(shape).astype(np.float32) / 8)
    x = ml.SparseTensor(coords, feats)
    pointwise = route == "cpu.pointwise"
    view = None if pointwise else backends.CPU.product_view(
        x.manager.submanifold_kernel_relation(x.coordinate_set, KernelGeometry((3, 3, 3), (1, 1, 1), (1, 1, 1))))
    ct = mx.array(rng.standard_normal((len(coords), c_out)).astype(np.float32))
    param = _grads(backends.CPU, route, feats, w, view, ct, groups)
    km = _grads(backends.CPU, route, feats, layout.kernel_major(w), view, ct, groups)
    assert param[2].shape == w.shape and param[4].shape == w.shape
    for i, (a, b) in enumerate(zip(param, km)):
        if i in (2, 4):  # weight gradients, each in its weight's layout
            b = layout.like(b, w)
        assert _bytes(a) == _bytes(b), i
    if groups == 1:
        w5 = w.reshape(c_out, 1, 1, 1, c_in) if w.ndim == 2 else w
        edges = [(i, i, 0) for i in range(len(coords))] if pointwise else oracle.conv_edges(coords, coords, 3, 1, 1)
        e_dx, e_dw, _ = oracle.grads(edges, np.array(feats), np.array(w5), np.array(ct))
        np.testing.assert_allclose(np.array(param[1]), e_dx, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.array(param[2]).reshape(e_dw.shape), e_dw, rtol=1e-4,
                                   atol=1e-4 * np.abs(e_dw).max())


def test_parameter_layout_reads_strided_and_flipped_parameters(rng):
    """A parameter that is itself a strided view (kernel axes that do not
    merge, or every other output channel), read transposed and mirrored,
    gives the bits of its contiguous copy read kernel-major."""
    coords = oracle.random_coords(rng, 200, 7, 2)
    # onto a copy of the rows: the submanifold's edges, not built symmetric
    # (a mirrored reading of a symmetric one is its other view, tested below)
    native = _ext.build_relation(_ext.CoordTable(mx.array(coords)), mx.array(coords), (3, 3, 3), (1, 1, 1),
                                 (1, 1, 1), (1, 1, 1), False, "submanifold")
    assert not native.symmetric
    rel = SimpleNamespace(_native=native)
    big = mx.array(rng.standard_normal((12, 3, 3, 3, 5)).astype(np.float32))
    views = {"outputs strided": big[::2], "kernel axes permuted": big[:6].transpose(0, 2, 1, 3, 4),
             "contiguous": mx.contiguous(big[:6])}
    for flip in ((True, False), (True, True), (False, True)):
        for name, w in views.items():
            a = 5 if flip[0] else 6
            f = mx.array(rng.standard_normal((len(coords), 6 if flip[0] else 5)).astype(np.float32))
            got = _ext.gather_conv(f, w, rel._native, _ext.View.output_major, "cpu.gather_gemm", CPU, flip=flip)
            want = _ext.gather_conv(f, autodiff.flipped_weight(mx.contiguous(layout.kernel_major(w)), flip),
                                    rel._native, _ext.View.output_major, "cpu.gather_gemm", CPU)
            mx.eval(got, want)
            assert got.shape == (len(coords), a)
            assert _bytes(got) == _bytes(want), (name, flip)


def test_parameter_layout_arguments_are_checked(rng):
    x = mx.ones((4, 5))
    view = _ext.View.output_major
    with pytest.raises(ValueError, match="K == 1"):
        _ext.gather_conv(x, mx.ones((3, 2, 5)).reshape(3, 2, 1, 1, 5), None, view, "cpu.pointwise")
    with pytest.raises(ValueError, match="expected x"):
        _ext.gather_conv(x, mx.ones((3, 4)), None, view, "cpu.pointwise")
    with pytest.raises(ValueError, match="reads no transposed weight"):
        _ext.gather_conv(x, mx.ones((5, 5)), None, view, "cpu.grouped_gather", flip=(True, False))
    with pytest.raises(ValueError, match="shape must be a parameter"):
        _ext.weight_grad(x, mx.ones((4, 3)), None, view, 1, "cpu.wgrad_gemm", shape=[3, 2, 5])
    with pytest.raises(ValueError, match="shape must be a parameter"):
        _ext.weight_grad(x, mx.ones((4, 3)), None, view, 1, "cpu.wgrad_gemm", shape=[3, 1, 1, 1, 4])
    dw = _ext.weight_grad(x, mx.ones((4, 3)), None, view, 1, "cpu.wgrad_gemm", shape=[3, 5])
    np.testing.assert_array_equal(np.array(dw), np.full((3, 5), 4.0, np.float32))


def test_linear_layer_takes_its_weight_as_it_is(rng):
    """A Linear on a SparseTensor runs its (C_out, C_in) weight as the
    product's parameter: no reshape or transpose in the graph, the dense
    affine map's values, and a gradient of the weight's own shape."""
    coords = oracle.random_coords(rng, 100, 6, 2)
    feats = mx.array(rng.standard_normal((len(coords), 5)).astype(np.float32))
    lin = ml.nn.Linear(5, 3)
    x = ml.SparseTensor(coords, feats)
    y = lin(x)
    np.testing.assert_allclose(np.array(y.feats), np.array(feats @ lin.weight.T + lin.bias), rtol=1e-5, atol=1e-5)
    g = mx.grad(lambda w: ops.linear(x, w).feats.sum())(lin.weight)
    dot = __import__("io").StringIO()
    mx.export_to_dot(dot, g)
    assert "Reshape" not in dot.getvalue() and "Transpose" not in dot.getvalue()
    np.testing.assert_allclose(np.array(g), np.broadcast_to(np.array(feats).sum(0), (3, 5)), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match=r"C_in=5 \(last axis of \(C_out, C_in\)\)"):
        lin(ml.SparseTensor(coords, mx.ones((len(coords), 4))))


@pytest.mark.parametrize("route", ["cpu.gather_gemm", "cpu.grouped_gather"])
def test_products_read_operands_in_any_layout(rng, route):
    """Features, cotangents and weights as the graph leaves them (a
    transpose, a column slice, a broadcast row): the products take them with
    no Contiguous node in front and give the bits of dense copies."""
    coords = oracle.random_coords(rng, 220, 7, 2)
    x = ml.SparseTensor(coords, mx.zeros((len(coords), 1)))
    rel = x.manager.submanifold_kernel_relation(x.coordinate_set, KernelGeometry((3, 3, 3), (1, 1, 1), (1, 1, 1)))
    view = backends.CPU.product_view(rel)
    n, groups = len(coords), 2 if "grouped" in route else 1
    wide = mx.array(rng.standard_normal((n, 16)).astype(np.float32))
    layouts = {
        "transposed": mx.array(rng.standard_normal((6, n)).astype(np.float32)).T,
        "column slice": wide[:, 3:9],
        "broadcast row": mx.broadcast_to(wide[:1, :6], (n, 6)),
    }
    w = mx.array(rng.standard_normal((8, 3, 3, 3, 6 // groups)).astype(np.float32) / 8)
    ct = mx.array(rng.standard_normal((2 * n, 8)).astype(np.float32))[::2]  # rows strided
    for name, f in layouts.items():
        outs = []
        for a, c in ((f, ct), (mx.contiguous(f), mx.contiguous(ct))):
            def fn(a, b):
                return autodiff.conv(backends.CPU, route, a, b, view, groups)

            y, grads = mx.vjp(fn, [a, w], [c])
            if a is f:
                assert "Contiguous" not in str(_dot(y[0], *grads)), name
            outs.append([y[0], *grads])
        mx.eval(outs)
        for a, e in zip(*outs):
            assert _bytes(a) == _bytes(e), name


def _dot(*arrays):
    buf = __import__("io").StringIO()
    mx.export_to_dot(buf, *arrays)
    return buf.getvalue()
