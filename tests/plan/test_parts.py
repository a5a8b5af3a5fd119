"""A run continued mid-epoch under another plan (``babelfeed.plan.parts``): at an edit every stream goes back to
where the planning window in progress began reading it, the window's served rows stay served, and the edited plan
reads on from there. Checked on the positions each stream reads, over the epoch on both sides of the edit, at
random cut points (window ends, the epoch's first and last batch among them) and random edits."""

import collections

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import babelfeed
from babelfeed.plan.parts import Part, after, available, decode, direction_rows, encode, returned
from synthetic import config_for, make_data_bin
from babelfeed.errors import StateError

SAMPLERS = {"stratified": {}, "stream": {"data__shards": "all"}, "concat": {"data__shards": "all"}}
EDITS = [{}, {"mixing__temperature": 1.0}, {"data__directions": "aaa-bbb,aaa-ddd"}, {"batching__max_tokens": 256},
         {"mixing__temperature": 2.0, "batching__max_tokens": 384}]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("parts")
    make_data_bin(r)
    return r


def read(planner, epoch: int, lo: int, hi: int) -> dict:
    """Per stream, the positions of its sequence that the served batches ``[lo, hi)`` of ``epoch`` read (the rows
    of a batch matched to positions as the handoff matches them)."""
    out = collections.defaultdict(list)
    setup = planner.setup(epoch)
    start, w = planner.first_batch(epoch), 0
    while planner._exists(setup, w):
        win = planner.window(epoch, w)
        n = len(win)
        a, b = max(lo, start), min(hi, start + n)
        if a < b:
            which, pos, rows = planner.window_positions(epoch, w)
            other = win.batch_rows(np.setdiff1d(np.arange(n), np.arange(a - start, b - start)))
            used = ~returned(which, rows, win.samples.direction[other].astype(np.int64),
                             direction_rows(setup.directions, win.samples[other]))
            for d in np.unique(which[used]).tolist():
                out[planner.keys[d]] += pos[used & (which == d)].tolist()
        start += n
        w += 1
    return out


def build(root, sampler, window, **over):
    return babelfeed.build_train_iterator(config_for(root, mixing__sampler=sampler, batching__window=window,
                                                     **SAMPLERS[sampler], **over)).planner


@settings(max_examples=30, deadline=None)
@given(sampler=st.sampled_from(sorted(SAMPLERS)), window=st.sampled_from([0, 150, 300]),
       edit=st.integers(0, len(EDITS) - 1), where=st.floats(0, 1), boundary=st.booleans())
def test_an_edit_repeats_and_loses_no_position(root, sampler, window, edit, where, boundary):
    a = build(root, sampler, window)
    n = a.num_batches(1)
    g = int(round(where * n))
    if boundary:  # a window's first batch
        g = a.window_start(1, a.locate(1, min(g, n - 1))[0])
    b = build(root, sampler, window, **EDITS[edit])
    part = a.handoff(1, g)
    b.begin(part)
    first = read(a, 1, 0, g)
    rest = read(b, 1, g, b.num_batches(1)) if part.epoch == 1 else {}
    for key in set(first) | set(rest):
        both = first.get(key, []) + rest.get(key, [])
        assert len(both) == len(set(both)), (key, sorted(k for k, c in collections.Counter(both).items() if c > 1))
        assert key in b.keys or not rest.get(key)  # a removed stream is not read again
    if sampler == "stream":  # every stream read a prefix of itself, and the served positions still ahead
        ends = b.epoch_start(2)[0]
        for d, key in enumerate(b.keys):
            ahead = b.served_ahead.get(d, np.zeros(0, np.int64))
            assert set(first.get(key, []) + rest.get(key, [])) == set(range(int(ends[d]))) | set(
                ahead[ahead >= ends[d]].tolist()), key
    elif not EDITS[edit] and part.epoch == 1:  # an edit that changes nothing reads the epoch's draw, once
        setup = a.setup(1)
        for d, key in enumerate(a.keys):
            assert sorted(first.get(key, []) + rest.get(key, [])) == list(range(int(setup.counts[d]))), key


@pytest.mark.parametrize("sampler", ["stratified", "stream"])
def test_the_edited_mixture_rules_from_the_first_batch_after_the_edit(root, sampler):
    """A corpus added by an edit is in the first batches after it at its share, a removed one in none, and a
    corpus the edit gives more share reads on into its extension (stratified) or further in its stream."""
    a = build(root, sampler, 0, data__directions="aaa-bbb,aaa-ccc")
    n = a.num_batches(1)
    g = n // 3
    b = build(root, sampler, 0, data__directions="aaa-bbb,aaa-ddd", mixing__temperature=50.0)
    b.begin(a.handoff(1, g))
    rest = read(b, 1, g, b.num_batches(1))
    assert "aaa-ccc" not in rest and len(rest["aaa-ddd"]) > 0
    setup = b.setup(1)
    share = {k: float(p) for k, p in zip(b.keys, setup.probs)}
    total = sum(len(v) for v in rest.values())
    assert abs(len(rest["aaa-ddd"]) / total - share["aaa-ddd"]) < 0.05
    # the first batch after the edit already holds the added corpus (nearly uniform at T=50: ~half its rows)
    w, j = b.locate(1, g)
    win = b.window(1, w)
    first = {b.keys[d] for d in win.samples.direction[win.batch(j)].tolist()}
    assert "aaa-ccc" not in first


def test_positions_skip_what_was_served():
    served = np.array([3, 4, 7, 10], np.int64)
    assert available(2, served, np.arange(6)).tolist() == [2, 5, 6, 8, 9, 11]
    assert available(5, served, np.arange(3)).tolist() == [5, 6, 8]
    assert after(2, served, 2)[0] == 5 and after(2, served, 6)[0] == 8 and after(8, served, 9)[0] == 11
    assert after(2, served, None)[0] == 2


@given(st.lists(st.integers(0, 10**9), max_size=200))
def test_served_positions_round_trip_as_text(values):
    p = np.unique(np.array(values, np.int64))
    assert decode(encode(p)).tolist() == p.tolist()


def test_a_part_round_trips_through_its_state_and_refuses_damage():
    part = Part(2, 17, 900, 0.25, {"a": 5, "b": 0}, {"a": np.array([6, 9])}, {"a": (40, "mix"), "b": (0, None)},
                0, {"a": 30, "b": 0}, {"a": 0.7, "b": 0.3})
    back = Part.from_state(part.to_state())
    assert back.to_state() == part.to_state() and back.served["a"].tolist() == [6, 9]
    state = part.to_state()
    for bad in ({**state, "done": 2.0}, {**state, "served": {"a": "garbage"}}, {**state, "base": {"a": [1, "x", 0, 0]}},
                {k: v for k, v in state.items() if k != "positions"}):
        with pytest.raises(StateError, match="part"):
            Part.from_state(bad)


def test_rows_go_back_as_many_times_as_unserved_batches_hold_them():
    which = np.array([0, 0, 0, 1, 1])
    rows = np.array([5, 5, 7, 5, 2])
    back = returned(which, rows, np.array([0, 1]), np.array([5, 2]))
    assert back.tolist() == [True, False, False, False, True]  # the first draw of (0, 5), and (1, 2)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_returned_matches_a_count_of_each_rows_unserved_draws(data):
    """Against a plain count: each (stream, row) sends back its first ``k`` draws in reading order, ``k`` the times
    the unserved batches hold it (rows drawn several times, and unserved rows the draws never read, included)."""
    n = data.draw(st.integers(0, 60))
    which = np.array(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), np.int64)
    rows = np.array(data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)), np.int64)
    m = data.draw(st.integers(0, 60))
    back_which = np.array(data.draw(st.lists(st.integers(0, 4), min_size=m, max_size=m)), np.int64)
    back_rows = np.array(data.draw(st.lists(st.integers(0, 6), min_size=m, max_size=m)), np.int64)
    left = collections.Counter(zip(back_which.tolist(), back_rows.tolist()))
    want = []
    for k in zip(which.tolist(), rows.tolist()):
        want.append(left[k] > 0)
        left[k] -= 1
    assert returned(which, rows, back_which, back_rows).tolist() == want
