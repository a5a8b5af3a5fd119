"""Static shapes for pairs as (B, L_src, L_tgt) boxes over the 2-D length histogram, and the O(n) planners."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from babelfeed.plan.shapes import assign, padded_rows, plan_shapes, shapes_from_widths


def objective(lengths, widths, sizes, windows, weights=None):
    """Padded tokens when every sample goes to its cheapest fitting box (ties: the first), masked rows included."""
    lengths = np.atleast_2d(np.asarray(lengths).T).T
    widths = np.atleast_2d(np.asarray(widths).T).T
    w = np.ones(len(lengths)) if weights is None else np.asarray(weights, float)
    per_sample = widths.sum(axis=1)
    total = 0.0
    chosen = []
    for x in lengths:
        fit = [k for k in range(len(widths)) if (x <= widths[k]).all()]
        assert fit, "a sample fits no box"
        chosen.append(min(fit, key=lambda k: (per_sample[k], k)))
    chosen = np.array(chosen)
    for k in range(len(widths)):
        n = w[chosen == k].sum()
        total += float(padded_rows(n, sizes[k], windows)) * per_sample[k]
    return total


def test_mirrored_pairs_fill_two_boxes_completely():
    """50 x (10, 100) + 50 x (100, 10): max(src, tgt) pads both to (100, 100) (55%); two boxes fill 100%."""
    pairs = np.array([(10, 100)] * 50 + [(100, 10)] * 50)
    old = plan_shapes(pairs, 2, max_tokens=5000, multiple=2, method="max")
    assert old.efficiency == pytest.approx(0.55)
    plan = plan_shapes(pairs, 2, max_tokens=5000, multiple=2)
    assert plan.efficiency == pytest.approx(1.0) and plan.fill == pytest.approx(1.0)
    assert sorted(plan.shapes) == [(50, 10, 100), (50, 100, 10)]
    assert (plan.bucket(pairs) == np.where(pairs[:, 0] == 10, plan.shapes.index((50, 10, 100)),
                                           plan.shapes.index((50, 100, 10)))).all()


pair_lists = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=50)


@settings(max_examples=120, deadline=None)
@given(pair_lists, st.integers(1, 4), st.sampled_from([0, 1, 3]), st.sampled_from([1, 4]))
def test_boxes_fit_are_cheapest_and_never_worse_than_max_plan(pairs, k, windows, multiple):
    arr = np.array(pairs)
    plan = plan_shapes(arr, k, max_tokens=160, multiple=multiple, windows=windows)
    assert 1 <= plan.num_shapes <= k
    assert (plan.batch_sizes * plan.widths.max(axis=1) <= 160).all()
    box = plan.bucket(arr)
    assert (box >= 0).all() and (arr <= plan.widths[box]).all()  # every sample fits its box
    cost = plan.widths.sum(axis=1)
    fits = (arr[:, None, :] <= plan.widths[None]).all(axis=2)
    assert (cost[box] == np.where(fits, cost[None], np.inf).min(axis=1)).all()  # the cheapest fitting box
    expected = objective(arr, plan.widths, plan.batch_sizes, windows)
    assert plan.padded == pytest.approx(expected)
    old = plan_shapes(arr, k, max_tokens=160, multiple=multiple, windows=windows, method="max")
    assert plan.padded <= old.padded + 1e-9
    assert plan.padded <= objective(arr, old.widths, old.batch_sizes, windows) + 1e-9


@settings(max_examples=40, deadline=None)
@given(pair_lists, st.lists(st.floats(0, 3), min_size=50, max_size=50), st.integers(1, 3))
def test_weighted_boxes_still_cover_zero_weight_samples(pairs, weights, k):
    arr = np.array(pairs)
    w = np.array(weights[:len(arr)])
    plan = plan_shapes(arr, k, max_tokens=160, multiple=1, weights=w)
    assert (plan.bucket(arr) >= 0).all()
    if w.sum() > 0:
        assert plan.padded == pytest.approx(objective(arr, plan.widths, plan.batch_sizes, 1, w))


def brute_force_1d(lengths, k, max_tokens, multiple, windows):
    """Least padded tokens (masked rows included) over every choice of at most k widths among the lengths."""
    values = np.unique(lengths)
    best = np.inf
    for r in range(1, min(k, len(values)) + 1):
        for ends in itertools.combinations(values[:-1], r - 1):
            widths = np.array(list(ends) + [values[-1]])
            sizes = np.maximum(max_tokens // widths, 1)
            sizes = np.where(sizes >= multiple, sizes - sizes % multiple, sizes)
            best = min(best, objective(lengths, widths, sizes, windows))
    return best


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=60), st.integers(1, 4), st.sampled_from([0, 1, 2]),
       st.sampled_from([1, 3]))
def test_1d_plan_is_the_exact_optimum_with_masked_rows(lengths, k, windows, multiple):
    arr = np.array(lengths)
    plan = plan_shapes(arr, k, max_tokens=64, multiple=multiple, windows=windows)
    assert plan.padded == pytest.approx(brute_force_1d(arr, k, 64, multiple, windows))
    assert plan.padded == pytest.approx(objective(arr, plan.widths, plan.batch_sizes, windows))


def test_assign_is_first_fit_in_plan_order():
    widths = np.array([(8, 24), (24, 8), (24, 24)])
    src = np.array([1, 8, 9, 20, 24, 25, 8])
    tgt = np.array([1, 24, 8, 20, 1, 1, 25])
    assert assign(widths, src, tgt).tolist() == [0, 0, 1, 2, 1, -1, -1]
    assert assign(np.array([4, 9]), np.array([1, 4, 5, 9, 10])).tolist() == [0, 0, 1, 1, -1]


def test_explicit_pair_shapes_are_ordered_by_cost():
    plan = shapes_from_widths([(64, 64), (16, 64), (64, 16)], np.array([(3, 50), (50, 3), (60, 60)]), 8192)
    assert [s[1:] for s in plan.shapes] == [(16, 64), (64, 16), (64, 64)]
    assert plan.bucket(np.array([(3, 50), (50, 3), (60, 60)])).tolist() == [0, 1, 2]


def test_real_looking_pairs_beat_the_max_plan():
    rng = np.random.default_rng(0)
    src = np.clip(rng.lognormal(3.2, 0.7, 100_000), 2, 256).astype(np.int64)
    ratio = np.where(rng.random(len(src)) < 0.5, 1.0, 1.8)  # two directions with different length ratios
    tgt = np.clip(src * ratio * rng.lognormal(0, 0.15, len(src)), 2, 256).astype(np.int64)
    pairs = np.stack([src, tgt], axis=1)
    for k in (2, 4, 8):
        old = plan_shapes(pairs, k, 16384, method="max")
        new = plan_shapes(pairs, k, 16384)
        assert new.padded < old.padded and new.fill > old.fill


def test_plans_from_histograms_need_no_sort(monkeypatch):
    """The planners histogram with bincount: no sort (np.unique, np.sort, np.argsort) ever sees the samples."""
    lengths = np.clip(np.random.default_rng(1).lognormal(3.2, 0.7, 50_000), 2, 256).astype(np.int64)
    pairs = np.stack([lengths, np.clip(lengths + 3, 2, 256)], axis=1)
    for name in ("unique", "sort", "argsort", "lexsort"):
        real = getattr(np, name)

        def guarded(a, *args, _real=real, _name=name, **kw):
            assert np.size(a) < 50_000, f"np.{_name} over the samples"
            return _real(a, *args, **kw)

        monkeypatch.setattr(np, name, guarded)
    plan_shapes(lengths, 8, 16384).bucket(lengths)
    plan_shapes(pairs, 8, 16384).bucket(pairs)
