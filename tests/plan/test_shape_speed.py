"""The fast pair histogram and assignment give exactly what the previous implementations gave.

The previous implementations are frozen in tests/previous_shapes.py. Cells, counts, plans, shares, padded and
real tokens must not change, bit for bit, with or without weights, and with lengths long enough that the
histogram is binned by a power of two; nor may the shape index of any sample.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import babelfeed.plan.shape_boxes as shape_boxes
from babelfeed.plan.shape_boxes import GRID_CELLS, pair_cells
from babelfeed.plan.shapes import assign, evaluate, plan_shapes
from previous_shapes import PreviousGrid, previous_assign, previous_pair_cells


def random_pairs(seed, n, top, skew):
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(np.log(top) / 2, 0.8, n), 1, top)
    tgt = np.clip(src * rng.choice([1.0, skew], n) * rng.lognormal(0, 0.2, n), 1, top)
    pairs = np.stack([src, tgt], axis=1).astype(np.int64)
    pairs[0] = (top, max(1, top // 3))  # the longest source: past 2048, the histogram is binned
    return pairs


def random_weights(seed, n, kind):
    rng = np.random.default_rng(seed + 1)
    if kind == "none":
        return None
    w = rng.random(n) * 3
    if kind == "zeros":
        w[rng.random(n) < 0.3] = 0.0
    return w


cases = st.tuples(st.integers(0, 10**6), st.integers(1, 3000), st.sampled_from([8, 40, 300, 2100, 5000]),
                  st.sampled_from([1.0, 0.5, 2.0]), st.sampled_from(["none", "positive", "zeros"]))


@settings(max_examples=60, deadline=None)
@given(cases)
def test_pair_cells_equal_the_previous_histogram(case):
    seed, n, top, skew, kind = case
    lengths = random_pairs(seed, n, top, skew)
    w = random_weights(seed, n, kind)
    cells, count, exact = pair_cells(lengths, w, lengths.max())
    tops = lengths.max(axis=0)
    assert exact == ((tops[0] + 2) * (tops[1] + 2) <= GRID_CELLS)  # not binned
    old_cells, old_count = previous_pair_cells(lengths, lengths.max(axis=0), w)
    assert cells.dtype == old_cells.dtype and np.array_equal(cells, old_cells)
    assert count.dtype == old_count.dtype and np.array_equal(count, old_count)


@settings(max_examples=25, deadline=None)
@given(cases, st.integers(1, 6), st.sampled_from([0, 1, 3]))
def test_plans_equal_the_plans_on_the_previous_histogram(case, k, windows):
    seed, n, top, skew, kind = case
    lengths = random_pairs(seed, n, top, skew)
    w = random_weights(seed, n, kind)
    plan = plan_shapes(lengths, k, 16384, windows=windows, weights=w)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(shape_boxes, "pair_cells", lambda x, w, longest: (*previous_pair_cells(x, x.max(axis=0), w), False))
        old = plan_shapes(lengths, k, 16384, windows=windows, weights=w)
    for name in ("edges", "widths", "batch_sizes", "share"):
        assert np.array_equal(getattr(plan, name), getattr(old, name)), name
    for name in ("efficiency", "padded", "real"):
        assert getattr(plan, name) == getattr(old, name), name
    w = None if w is not None and not w.sum() > 0 else w  # nothing weighs anything: the samples as they are
    real = lengths.sum() if w is None else w @ lengths[:, 0] + w @ lengths[:, 1]
    assert plan.real == float(real)


widths_2d = st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300)), min_size=1, max_size=9)


@settings(max_examples=80, deadline=None)
@given(widths_2d, st.integers(0, 10**6), st.integers(0, 70_000), st.booleans())
def test_assign_equals_the_previous_gathers(widths, seed, n, one_side):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 340, (n, 2))  # past every width, and 0
    w = np.array(widths)
    src, tgt = lengths[:, 0], (None if one_side else lengths[:, 1])
    got, want = assign(w, src, tgt), previous_assign(w, src, tgt)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    got, want = assign(w[:, 0], src), previous_assign(w[:, 0], src)  # 1-D widths
    assert got.dtype == want.dtype and np.array_equal(got, want)
    strided = np.asfortranarray(lengths)  # columns of other layouts and dtypes
    for s, t in ((strided[:, 0], strided[:, 1]), (src.astype(np.int32), lengths[:, 1].astype(np.int32))):
        got, want = assign(w, s, t), previous_assign(w, s, t)
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_assign_keeps_the_shape_of_its_inputs():
    w = np.array([(4, 8), (8, 4)])
    src, tgt = np.array([[1, 5], [9, 3]]), np.array([[7, 2], [1, 1]])
    assert np.array_equal(assign(w, src, tgt), previous_assign(w, src, tgt))
    assert np.array_equal(assign(w, 5, 2), previous_assign(w, 5, 2))


@pytest.mark.parametrize("n", [1, 2, 65_537])
def test_bucket_equals_the_previous_assignment(n):
    lengths = random_pairs(n, n, 256, 1.8)
    plan = plan_shapes(lengths, 8, 16384)
    assert np.array_equal(plan.bucket(lengths), previous_assign(plan.widths, lengths[:, 0], lengths[:, 1]))


def plans_with_both_searches(lengths, k, windows, w):
    plan = plan_shapes(lengths, k, 16384, windows=windows, weights=w)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(shape_boxes, "_Grid", PreviousGrid)
        old = plan_shapes(lengths, k, 16384, windows=windows, weights=w)
    return plan, old


@settings(max_examples=40, deadline=None)
@given(cases, st.integers(1, 9), st.sampled_from([0, 1, 3]))
def test_box_search_equals_the_previous_search(case, k, windows):
    seed, n, top, skew, kind = case
    lengths = random_pairs(seed, n, top, skew)
    plan, old = plans_with_both_searches(lengths, k, windows, random_weights(seed, n, kind))
    assert np.array_equal(plan.widths, old.widths) and plan.padded == old.padded


@pytest.mark.parametrize("k", [2, 8, 16])
def test_box_search_equals_the_previous_search_on_mixed_directions(k):
    rng = np.random.default_rng(k)
    src = np.clip(rng.lognormal(3.2, 0.7, 200_000), 2, 256)
    tgt = np.clip(src * rng.choice([0.6, 1.0, 1.4, 2.0], len(src)) * rng.lognormal(0, 0.15, len(src)), 2, 256)
    lengths = np.stack([src, tgt], axis=1).astype(np.int64)
    for w in (None, rng.random(len(src))):
        plan, old = plans_with_both_searches(lengths, k, 1, w)
        assert np.array_equal(plan.widths, old.widths) and plan.padded == old.padded
    assert plan.real == float(w @ lengths[:, 0] + w @ lengths[:, 1])  # real tokens summed as they were
    assert evaluate(plan, lengths, w).real == plan.real
    one_side = lengths[:, 0].copy()
    assert plan_shapes(one_side, k, 16384, weights=w).real == float(w @ one_side)
