import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from babelfeed.plan.batching import batch_sorted, fairseq_batch_by_size, fairseq_ordered_indices, length_order
from babelfeed.errors import DataError, UsageError

L = np.array([3, 3, 3, 4, 4, 5, 5, 5, 6, 7, 8, 9, 10, 12, 16, 20])


def as_lists(batches):
    return [b.tolist() for b in batches]


@pytest.mark.parametrize("kw,expected", [
    (dict(max_tokens=20), [[0, 1, 2, 3, 4], [5, 6, 7], [8, 9], [10, 11], [12], [13], [14], [15]]),
    (dict(max_tokens=20, required_batch_size_multiple=2), [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11], [12], [13],
                                                           [14], [15]]),
    (dict(max_tokens=20, required_batch_size_multiple=2, drop_last_partial=True),
     [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11], [12], [13], [14]]),
    (dict(max_tokens=40, required_batch_size_multiple=4), [list(range(8)), [8, 9, 10, 11], [12, 13], [14, 15]]),
    (dict(max_tokens=40, required_batch_size_multiple=4, drop_last_partial=True),
     [list(range(8)), [8, 9, 10, 11], [12, 13]]),
])
def test_fairseq_batch_by_size_reference(kw, expected):
    """The batches fairseq's own batch_by_size produced (shared/reference §2.1)."""
    assert as_lists(fairseq_batch_by_size(np.arange(16), L, **kw)) == expected


def test_fairseq_unsorted_and_limits():
    assert as_lists(fairseq_batch_by_size(np.arange(4), np.array([2, 10, 2, 2]), 20)) == [[0, 1], [2, 3]]
    assert as_lists(fairseq_batch_by_size(np.arange(5), np.ones(5, int), None, max_sentences=2)) == [[0, 1], [2, 3], [4]]
    with pytest.raises(DataError, match="more than max_tokens"):
        fairseq_batch_by_size(np.arange(3), np.array([1, 50, 1]), 20)
    assert fairseq_batch_by_size([], [], 10) == []


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=300), max_tokens=st.integers(64, 600),
       max_sentences=st.integers(0, 40), mult=st.sampled_from([1, 2, 4, 8]))
def test_batch_sorted_equals_fairseq_on_sorted_input(lengths, max_tokens, max_sentences, mult):
    cost = np.sort(np.array(lengths))
    ends = batch_sorted(cost, max_tokens, max_sentences or None, mult)
    ours = np.split(np.arange(len(cost)), ends[:-1])
    theirs = fairseq_batch_by_size(np.arange(len(cost)), cost, max_tokens, max_sentences or None, mult)
    assert as_lists(ours) == as_lists(theirs)
    for b in ours:  # the budget, and the multiple wherever more than `mult` samples fit
        assert len(b) * cost[b].max() <= max_tokens and (not max_sentences or len(b) <= max_sentences)


def test_batch_sorted_rejects_bad_input():
    with pytest.raises(UsageError, match="non-decreasing"):
        batch_sorted(np.array([3, 2]), 10)
    with pytest.raises(DataError, match="exceeds max_tokens"):
        batch_sorted(np.array([3, 20]), 10)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300)), min_size=1, max_size=500), st.integers(0, 99))
def test_length_order_sorts_by_cost_then_source(pairs, seed):
    src = np.array([p[0] for p in pairs])
    tgt = np.array([p[1] for p in pairs])
    order = length_order(src, tgt, np.random.default_rng(seed))
    assert sorted(order.tolist()) == list(range(len(pairs)))
    key = list(zip(np.maximum(src, tgt)[order].tolist(), src[order].tolist()))
    assert key == sorted(key)


def test_fairseq_ordered_indices_is_lexicographic_and_leaves_global_rng_alone():
    src = np.array([5, 3, 5, 3, 1])
    tgt = np.array([2, 9, 1, 9, 4])
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    order = fairseq_ordered_indices(src, tgt, seed=1)
    assert (np.random.get_state()[1] == before).all()
    key = list(zip(src[order].tolist(), tgt[order].tolist()))
    assert key == sorted(key)
    assert set(order[:1].tolist()) == {4} and set(order[1:3].tolist()) == {1, 3}
