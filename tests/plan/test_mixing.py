import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import babelfeed
from babelfeed.plan.mixing import (StratifiedDraw, fairseq_class_hash, fairseq_draw, stratified_counts, virtual_size,
                           weight_probabilities)
from babelfeed.permute import derive_key, permute
from babelfeed.errors import BabelfeedError, UsageError
from helpers import unimax_as_written


def test_probabilities_formula():
    s = [1000, 100, 10]
    assert np.allclose(babelfeed.sampling_probabilities(s, 1.0), np.array(s) / 1110)
    p = babelfeed.sampling_probabilities(s, 2.0)
    assert np.allclose(p, np.sqrt(s) / np.sqrt(s).sum())
    assert np.allclose(p.round(3), [0.706, 0.223, 0.071])
    assert np.allclose(babelfeed.sampling_probabilities(s, 1e9), 1 / 3)
    assert babelfeed.sampling_probabilities([10**12, 1], 100.0).sum() == pytest.approx(1.0)
    assert babelfeed.sampling_probabilities([5, 0], 2.0).tolist() == [1.0, 0.0]
    for bad in ([], [-1, 2], [0, 0]):
        with pytest.raises(BabelfeedError):
            babelfeed.sampling_probabilities(bad)
    with pytest.raises(UsageError, match="temperature"):
        babelfeed.sampling_probabilities([1, 2], 0)
    assert weight_probabilities([1, 3]).tolist() == [0.25, 0.75]


@pytest.mark.parametrize("T,V,counts", [(1, 1110, [1000, 100, 10]), (2, 1416, [1001, 316, 99]),
                                        (5, 1665, [822, 517, 326])])
def test_fairseq_reference_values(T, V, counts):
    """The table fairseq's own SampledMultiDataset produced (shared/reference §3.2)."""
    s = [1000, 100, 10]
    p = babelfeed.sampling_probabilities(s, T)
    v = virtual_size(s, p)
    assert v == V
    if T > 1:  # T=1 is fairseq's concat path (no draw)
        assert [len(i) for i in fairseq_draw(s, p, v, epoch=1)] == counts


def test_fairseq_draw_details():
    assert fairseq_class_hash() == 1944279108
    assert fairseq_class_hash("SampledMultiEpochDataset") == 2770590817
    s = [1000, 100, 10]
    p = babelfeed.sampling_probabilities(s, 2)
    a = fairseq_draw(s, p, 1416, epoch=1)
    b = fairseq_draw(s, p, 1416, epoch=1)
    assert all((x == y).all() for x, y in zip(a, b))
    assert not all(len(x) == len(y) and (x == y).all() for x, y in zip(a, fairseq_draw(s, p, 1416, epoch=2)))
    # c > n: the whole draw is with replacement; about a third of the rows are never seen
    assert len(a[0]) == 1001 and 550 < len(np.unique(a[0])) < 720
    p5 = babelfeed.sampling_probabilities(s, 5)
    d5 = fairseq_draw(s, p5, 1665, epoch=1)
    assert len(d5[0]) == 822 and len(np.unique(d5[0])) == 822  # c <= n: without replacement


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 400), count=st.integers(0, 2000), seed=st.integers(0, 10**6))
def test_stratified_every_row_floor_or_ceil_times(n, count, seed):
    draw = StratifiedDraw(n, count, (seed, "t"))
    rows = draw.rows(np.arange(count))
    hist = np.bincount(rows, minlength=n)
    assert len(hist) == n and hist.sum() == count
    assert hist.min() >= count // n and hist.max() <= -(-count // n)
    # any split of the positions gives the same rows: the sequence is addressable window by window
    cut = count // 3
    assert (np.concatenate([draw.rows(np.arange(cut)), draw.rows(np.arange(cut, count))]) == rows).all()


@settings(max_examples=200, deadline=None)
@given(probs=st.lists(st.floats(0, 1), min_size=1, max_size=12).filter(lambda p: sum(p) > 0),
       total=st.integers(0, 10**7))
def test_stratified_counts_add_up(probs, total):
    p = np.array(probs) / sum(probs)
    c = stratified_counts(p, total)
    assert c.sum() == total and (c >= np.floor(p * total) - 1e-9).all() and (c <= np.floor(p * total) + 1).all()


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 5000), seed=st.integers(0, 2**32 - 1))
def test_permute_is_a_bijection(n, seed):
    p = permute(np.arange(n), n, derive_key(seed))
    assert np.array_equal(np.sort(p), np.arange(n))


# -- UniMax and the cap on up-sampling ----------------------------------------------------------------------------

sizes_st = st.lists(st.integers(1, 10**6), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(sizes=sizes_st, budget_share=st.floats(0.01, 20), max_epochs=st.floats(0.05, 50))
def test_the_uniform_mixture_capped_is_unimax(sizes, budget_share, max_epochs):
    """The planner's UniMax is the uniform mixture with every corpus capped at N epochs and the excess shared:
    the same shares as the paper's algorithm, with the budget no larger than the caps allow."""
    from babelfeed.plan.mixing import capped_probabilities

    total = min(budget_share * sum(sizes), max_epochs * sum(sizes))
    want = np.array(unimax_as_written(sizes, total, max_epochs))
    got = capped_probabilities(np.full(len(sizes), 1.0 / len(sizes)), sizes, total, max_epochs) * total
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-6 * total)


@settings(max_examples=300, deadline=None)
@given(sizes=sizes_st, temperature=st.floats(1, 100), cap=st.floats(0.5, 50), share=st.floats(0.1, 5))
def test_a_capped_mixture_keeps_every_corpus_under_its_cap_and_the_order_of_the_rest(sizes, temperature, cap, share):
    from babelfeed.plan.mixing import capped_probabilities

    total = min(share * sum(sizes), cap * sum(sizes))
    p = babelfeed.sampling_probabilities(sizes, temperature)
    q = capped_probabilities(p, sizes, total, cap)
    assert q.sum() == pytest.approx(1.0) and (q * total <= np.array(sizes) * cap * (1 + 1e-9) + 1e-6).all()
    free = q * total < np.array(sizes) * cap * (1 - 1e-9)
    if free.sum() > 1:  # the uncapped keep their proportions (the excess shared in proportion)
        np.testing.assert_allclose(q[free] / q[free].sum(), p[free] / p[free].sum(), rtol=1e-7)
