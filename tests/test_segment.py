"""Segment sums: the fixed-order GPU plan against a NumPy oracle, and its
reproducibility (planned on the CPU here by forcing the GPU branch)."""

import numpy as np
import pytest
import mlx.core as mx

from mlx_lattice import _segment


def oracle_sum(values, ids, n_segments):
    out = np.zeros((n_segments, values.shape[1]), np.float64)
    np.add.at(out, ids, values.astype(np.float64))
    return out


@pytest.fixture
def gpu_plan(monkeypatch):
    monkeypatch.setattr(_segment, "_scatter_unordered", lambda: True)


CASES = [
    (0, 3, 2),  # no rows
    (1, 1, 3),
    (40, 7, 5),  # short segments, one level
    (2000, 3, 4),  # long segments: several levels
    (3000, 1000, 2),  # many segments, some empty
    (5000, 2, 1),  # one huge and one tiny segment
]


@pytest.mark.parametrize("n,n_segments,c", CASES)
def test_ordered_sum_matches_oracle(gpu_plan, n, n_segments, c):
    rng = np.random.default_rng(n + n_segments)
    if n_segments == 2 and n == 5000:
        ids = np.r_[np.zeros(n - 1, np.int64), [1]]
    else:
        ids = rng.integers(0, n_segments, n)
    values = rng.standard_normal((n, c)).astype(np.float32)
    got = _segment.segment_sum(mx.array(values), mx.array(ids.astype(np.int32)), n_segments)
    assert got.shape == (n_segments, c) and got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), oracle_sum(values, ids, n_segments), rtol=1e-5, atol=1e-4)
    # empty segments are exactly zero
    empty = np.bincount(ids, minlength=n_segments) == 0
    assert (np.array(got)[empty] == 0).all()


def test_ordered_levels_add_in_fixed_pieces():
    ids = np.array([2, 0, 2, 2, 0, 2, 2], np.int64)
    levels, last = _segment._ordered_levels(ids, 4, piece=2)
    # segment 0: rows 1, 4 (one piece); segment 2: rows 0,2 | 3,5 | 6
    first = np.array(levels[0])
    assert first.tolist() == [[1, 4], [0, 2], [3, 5], [6, 7]]
    # segment 2 has three pieces, then two, then one: three levels in all
    assert len(levels) == 3 and last[1] == last[3] == 2  # empty segments read the zero row


def test_ordered_sum_half_and_gradients(gpu_plan):
    rng = np.random.default_rng(3)
    ids = mx.array(rng.integers(0, 6, 300).astype(np.int32))
    v = mx.array(rng.standard_normal((300, 3)).astype(np.float16))
    got = _segment.segment_sum(v, ids, 6)
    assert got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), oracle_sum(np.array(v).astype(np.float32), np.array(ids), 6), rtol=1e-3, atol=1e-2)
    # the JVP is the same sum of the tangent; the VJP a gather
    x = mx.array(rng.standard_normal((300, 3)).astype(np.float32))
    t = mx.array(rng.standard_normal((300, 3)).astype(np.float32))
    g = mx.array(rng.standard_normal((6, 3)).astype(np.float32))
    fn = lambda f: _segment.segment_sum(f, ids, 6)  # noqa: E731
    (jt,) = mx.jvp(fn, [x], [t])[1]
    (vg,) = mx.vjp(fn, [x], [g])[1]
    np.testing.assert_allclose((jt * g).sum().item(), (t * vg).sum().item(), rtol=1e-4)
    np.testing.assert_array_equal(np.array(vg), np.array(g)[np.array(ids)])


def test_ordered_sum_is_reproducible_and_independent_of_other_segments(gpu_plan):
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 3, 4000)
    values = rng.standard_normal((4000, 4)).astype(np.float32)
    a = np.array(_segment.segment_sum(mx.array(values), mx.array(ids.astype(np.int32)), 3))
    b = np.array(_segment.segment_sum(mx.array(values), mx.array(ids.astype(np.int32)), 3))
    np.testing.assert_array_equal(a, b)
    changed = values.copy()
    changed[ids == 0] *= 3
    c = np.array(_segment.segment_sum(mx.array(changed), mx.array(ids.astype(np.int32)), 3))
    np.testing.assert_array_equal(c[1:], a[1:])


def test_traced_ids_fall_back_to_the_scatter(gpu_plan):
    rng = np.random.default_rng(6)
    ids = mx.array(rng.integers(0, 4, 50).astype(np.int32))
    v = mx.array(rng.standard_normal((50, 2)).astype(np.float32))
    eager = _segment.segment_sum(v, ids, 4)
    compiled = mx.compile(lambda a, s: _segment.segment_sum(a, s, 4))(v, ids)
    np.testing.assert_allclose(np.array(compiled), np.array(eager), rtol=1e-6, atol=1e-6)
