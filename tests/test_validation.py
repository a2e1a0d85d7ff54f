"""Bad input gets a clear ValueError/TypeError naming the argument; empty works."""

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import ops

import oracle


@pytest.fixture
def x(rng):
    coords = oracle.random_coords(rng, 30, 5, 1)
    return ml.SparseTensor(coords, rng.standard_normal((len(coords), 3)).astype(np.float32))


def w(c_out=4, k=3, c_in=3, dtype=mx.float32):
    return mx.zeros((c_out, k, k, k, c_in), dtype=dtype)


@pytest.mark.parametrize(
    "coords,exc,match",
    [
        (np.zeros((3, 3), np.int32), ValueError, r"coords must have shape \(N, 4\)"),
        (np.zeros((3, 4), np.float32), TypeError, "coords must have an integer dtype"),
        (np.zeros((2, 4, 1), np.int32), ValueError, "coords must have shape"),
        (np.array([[0, 70000, 0, 0]], np.int32), ValueError, "range"),
        (np.array([[-1, 0, 0, 0]], np.int32), ValueError, "range"),
        (np.array([[5000, 0, 0, 0]], np.int32), ValueError, "range"),
        (np.array([[0, 1, 2, 3], [0, 1, 2, 3]], np.int32), ValueError, "duplicate"),
        (np.array([[0, 2**40, 0, 0]], np.int64), ValueError, "int32"),
    ],
)
def test_bad_coords(coords, exc, match):
    with pytest.raises(exc, match=match):
        ml.SparseTensor(coords, np.zeros((len(coords), 2), np.float32))


def test_bad_feats():
    c = np.array([[0, 0, 0, 0], [0, 1, 0, 0]], np.int32)
    with pytest.raises(ValueError, match="feats has 3 rows but coords has 2"):
        ml.SparseTensor(c, np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match="feats must be"):
        ml.SparseTensor(c, mx.zeros((2, 2), dtype=mx.int32))
    with pytest.raises(ValueError, match=r"feats must have shape \(N, C\)"):
        ml.SparseTensor(c, np.zeros((2,), np.float32))
    with pytest.raises(ValueError, match="batch_counts"):
        ml.SparseTensor(c, np.zeros((2, 1), np.float32), batch_counts=[1, 1])
    with pytest.raises(ValueError, match="stride must be positive"):
        ml.SparseTensor(c, np.zeros((2, 1), np.float32), stride=0)


@pytest.mark.parametrize("kind", ["numpy", "mlx", "list", "float16", "int64"])
def test_swapped_coords_and_feats_are_named(rng, kind):
    """TorchSparse's order, SparseTensor(feats, coords): the error says the
    arguments look swapped, whatever the array kind."""
    coords = oracle.random_coords(rng, 20, 5, 2)
    feats = rng.standard_normal((len(coords), 3)).astype(np.float32)
    f, c = {
        "numpy": (feats, coords),
        "mlx": (mx.array(feats), mx.array(coords)),
        "list": (feats.tolist(), coords.tolist()),
        "float16": (mx.array(feats).astype(mx.float16), coords),
        "int64": (feats.astype(np.float64), coords.astype(np.int64)),
    }[kind]
    with pytest.raises(TypeError, match=r"coords must have an integer dtype.*arguments look swapped.*"
                                        r"SparseTensor\(coords, feats\)"):
        ml.SparseTensor(f, c)
    # the right order works with the same arrays
    assert len(ml.SparseTensor(c, f)) == len(coords)


def test_float_coords_alone_are_not_called_swapped(rng):
    # float coordinates with float features (or features that are not (N, 4)
    # integers) are a plain dtype error, without the swap hint
    for feats in (np.zeros((3, 2), np.float32), np.zeros((3, 3), np.int32), np.zeros((3, 4, 1), np.int32)):
        with pytest.raises(TypeError, match="coords must have an integer dtype") as e:
            ml.SparseTensor(np.zeros((3, 4), np.float32), feats)
        assert "swapped" not in str(e.value)


def test_bad_weights(x):
    with pytest.raises(ValueError, match=r"weight must have shape \(C_out, Kx, Ky, Kz, C_in\)"):
        ops.conv3d(x, mx.zeros((4, 27, 3)))
    with pytest.raises(ValueError, match="C_in=5"):
        ops.subm_conv3d(x, w(c_in=5))
    with pytest.raises(TypeError, match="weight dtype float16 does not match feats dtype float32"):
        ops.conv3d(x, w(dtype=mx.float16))
    with pytest.raises(TypeError, match="weight must be an mx.array"):
        ops.conv3d(x, np.zeros((4, 3, 3, 3, 3), np.float32))
    with pytest.raises(ValueError, match=r"bias must have shape \(4,\)"):
        ops.conv3d(x, w(), mx.zeros((5,)))
    with pytest.raises(TypeError, match="bias dtype"):
        ops.conv3d(x, w(), mx.zeros((4,), dtype=mx.float16))
    with pytest.raises(TypeError, match="x must be a SparseTensor"):
        ops.conv3d(mx.zeros((3, 3)), w())
    with pytest.raises(ValueError, match="empty axis"):
        ops.conv3d(x, mx.zeros((4, 0, 3, 3, 3)))


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(stride=0), ValueError, "stride must be positive"),
        (dict(stride=-2), ValueError, "stride must be positive"),
        (dict(stride=(1, 2)), TypeError, "stride must be an int or a 3-tuple"),
        (dict(stride=1.5), TypeError, "stride must be an int"),
        (dict(dilation=0), ValueError, "dilation must be positive"),
        (dict(padding=-1), ValueError, r"padding must be >= 0"),
        (dict(padding=(0, 0, -1)), ValueError, r"padding must be >= 0"),
    ],
)
@pytest.mark.parametrize("op", [ops.conv3d, ops.conv_transpose3d, ops.generative_conv_transpose3d])
def test_bad_geometry(x, op, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        op(x, w(), **kwargs)


def test_bad_target(x):
    with pytest.raises(ValueError, match=r"coordinates must have shape \(N, 4\)"):
        ops.conv3d(x, w(), coordinates=np.zeros((3, 3), np.int32))
    with pytest.raises(ValueError, match="duplicate"):
        ops.conv3d(x, w(), coordinates=np.zeros((2, 4), np.int32))
    other = ml.SparseTensor(np.zeros((1, 4), np.int32), np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="same CoordinateManager"):
        ops.conv3d(x, w(), coordinates=other)


def test_generated_support_out_of_range():
    x = ml.SparseTensor(np.array([[0, 40000, 0, 0]], np.int32), np.ones((1, 1), np.float32))
    with pytest.raises(ValueError, match="output coordinate .* range"):
        ops.generative_conv_transpose3d(x, mx.ones((1, 2, 2, 2, 1)), stride=2)


@pytest.mark.parametrize("op", ["conv3d", "subm", "transpose", "generative", "pointwise", "target"])
def test_empty_input(op):
    x = ml.SparseTensor(np.zeros((0, 4), np.int32), np.zeros((0, 3), np.float32))
    wt = w(k=1 if op == "pointwise" else 3)
    b = mx.ones((4,))
    if op == "conv3d":
        y = ops.conv3d(x, wt, b, stride=2)
    elif op == "subm":
        y = ops.subm_conv3d(x, wt, b)
    elif op == "transpose":
        y = ops.conv_transpose3d(x, wt, b, stride=2)
    elif op == "generative":
        y = ops.generative_conv_transpose3d(x, wt, b, stride=2)
    elif op == "pointwise":
        y = ops.conv3d(x, wt, b)
    else:
        # empty input onto non-empty target: bias only
        y = ops.conv3d(x, wt, b, coordinates=np.array([[0, 1, 2, 3]], np.int32))
        np.testing.assert_array_equal(np.array(y.feats), np.ones((1, 4)))
        return
    assert y.feats.shape == (0, 4) and y.coords.shape == (0, 4)
    g = mx.grad(lambda f, wt: ops.subm_conv3d(x.replace(f), wt).feats.sum(), argnums=(0, 1))(x.feats, w())
    assert g[0].shape == (0, 3) and np.all(np.array(g[1]) == 0)


def test_no_edges_gives_zero_rows():
    x = ml.SparseTensor(np.array([[0, 0, 0, 0]], np.int32), np.ones((1, 2), np.float32))
    y = ops.conv3d(x, mx.ones((3, 3, 3, 3, 2)), coordinates=np.array([[0, 10, 10, 10], [1, 0, 0, 0]], np.int32))
    np.testing.assert_array_equal(np.array(y.feats), np.zeros((2, 3)))
