"""The state's history list (version 2): one list of events, read back by every part, and version-1 states
(four logs) upgraded to it without loss."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import babelfeed
from babelfeed.run.history import check, compose, ran_on, upgrade
from babelfeed.errors import HistoryError, StateError
from golden import digest
from helpers import as_v1, hist
from synthetic import config_for, make_data_bin

TASKS = ["a", "b"]


@st.composite
def logs(draw):
    """Random parts of a run: step segments, per segment weight changes and update counts (as the planner makes
    them: a count either starts after the last or replaces those not in effect yet), and the edits between."""
    n_edits = draw(st.integers(0, 3))
    updates = [[0, 0.0, draw(st.integers(1, 8))]] if draw(st.booleans()) else []
    batch, step = 0, 0
    edits, steps = [], [[0, 1, 0, draw(st.integers(1, 4))]]
    segments = []
    for k in range(n_edits + 1):
        weights = []
        for _ in range(draw(st.integers(0, 3))):
            batch += draw(st.integers(0, 50))
            weights.append([batch, {t: draw(st.floats(0, 5)) for t in TASKS}])
        if updates:
            for _ in range(draw(st.integers(0, 2))):
                b = draw(st.integers(1, batch + 60))
                updates = [u for u in updates if u[0] < b] or [[0, 0.0, updates[0][2]]]
                if updates[-1][0] < b:
                    updates.append([b, float(draw(st.integers(0, 30))), draw(st.integers(1, 8))])
        step += draw(st.integers(0, 20))
        if draw(st.booleans()):
            steps.append([step, draw(st.integers(1, 3)), draw(st.integers(0, 40)), draw(st.integers(1, 4))])
        segments.append((weights, [list(u) for u in updates]))
        if k < n_edits:
            batch += draw(st.integers(0, 50))
            saved_at = step + draw(st.integers(0, 5))
            edits.append({"saved_at_step": saved_at, "step": saved_at + draw(st.integers(0, 4)),
                          "global_batch": batch, "epoch": draw(st.integers(1, 4)),
                          "changes": {"mixing.temperature": [1.0, float(k + 2)]},
                          "saved": {"epoch": 1 + k, "consumed": draw(st.integers(0, 40)), "weights": weights,
                                    "updates": [list(u) for u in updates]}})
            step = edits[-1]["step"]
    return steps, edits, segments


@given(logs())
@settings(max_examples=300, deadline=None)
def test_every_part_reads_back_what_it_wrote(parts):
    steps, edits, segments = parts
    weights, updates = segments[-1]
    history = compose(steps, weights, updates, edits)
    v = check(json.loads(json.dumps(history)))
    assert v.steps == steps
    assert v.weights == weights
    assert v.updates == updates
    assert v.edits == edits  # each edit's saved run: its weights and update counts, read back from the list
    assert len([e for e in history if e["event"] == "edit"]) == len(edits)
    assert len([e for e in history if e["event"] == "weights"]) == sum(len(w) for w, _ in segments)


def test_a_history_that_is_not_well_formed_is_refused_by_event():
    good = compose([[0, 1, 0, 2]], [[3, {"a": 1.0}]], [[0, 0.0, 2]], [])
    check(good)
    for bad, match in (("x", "must be a list"), ([{"event": "ranks"}], "event 0 is .*'ranks'"),
                       ([*good, {"event": "weights", "batch": 1, "weights": {"a": -1}}], "event 3 is"),
                       ([*good, {"event": "weights", "batch": 1, "weights": {"a": 1}}], "training order"),
                       ([{"event": "updates", "batch": 4, "update": 1.0, "per": 2}], "start at global batch 0"),
                       ([*good, {"event": "edit", "saved_at_step": 1, "step": 0, "global_batch": 0, "epoch": 1,
                                 "changes": {}}], "event 3 is")):
        with pytest.raises(HistoryError, match=match):
            check(bad)
    with pytest.raises(HistoryError, match="total_steps=0"):
        check(compose([[0, 1, 0, 2], [4, 1, 8, 1]], [], [], []), total_steps=0)


def test_ran_on_reads_the_world_size_from_any_state():
    state = {"version": 2, "history": compose([[0, 1, 0, 2], [5, 1, 10, 3]], [], [], [])}
    assert [ran_on(state, s) for s in (1, 5, 6, None)] == [2, 2, 3, 3]
    assert ran_on(as_v1({**state, "name": "train"}), 6) == 3
    assert ran_on({"epoch": 1, "consumed": 3, "fingerprint": "f", "world_size": 4}) == 4
    assert ran_on({"epoch": 1, "consumed": 3, "fingerprint": "f", "base": state}, 2) == 2
    assert ran_on({"epoch": 1, "consumed": 3, "fingerprint": "f"}) is None


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("history")
    make_data_bin(root)
    return root


SCHEDULED = {"mixing__sampler": "stream", "data__shards": "all", "batching__window": 100,
             "mixing__schedule__boundaries": "6,14", "mixing__schedule__mode": "step",
             "mixing__schedule__weights": "aaa-bbb:1,aaa-ccc:0,aaa-ddd:1 | aaa-bbb:1,aaa-ccc:1,aaa-ddd:0 | "
                                          "aaa-bbb:0,aaa-ccc:1,aaa-ddd:1"}


def test_a_version_1_state_upgrades_to_the_state_this_babelfeed_writes(root):
    """A run with every kind of event (weight changes, a schedule counted on two world sizes, a mixture edit):
    its state written as version 1 upgrades to exactly the version-2 state, and resumes to the same batches."""
    cfg = config_for(root, **SCHEDULED)
    its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=2) for r in range(2)]
    tasks = its[0].planner.sources.tasks
    for step in range(7):
        for it in its:
            next(it, None)
            if step == 3:
                it.set_weights({t: 1.0 + i for i, t in enumerate(tasks)})
    s1 = json.loads(json.dumps(its[0].get_state()))
    three = [babelfeed.build_train_iterator(cfg, rank=r, world_size=3) for r in range(3)]
    for it in three:
        it.set_state(s1)
    for step in range(25):
        for it in three:
            next(it, None)
            if step == 10:
                it.set_weights({t: 3.0 - i for i, t in enumerate(tasks)})
    s2 = json.loads(json.dumps(three[0].get_state()))
    edited = config_for(root, **SCHEDULED, mixing__temperature=1.5)
    one = babelfeed.build_train_iterator(edited)
    one.set_state(s2, mixture_change="allow")
    for _ in range(40):
        next(one, None)  # (an epoch's end: StopIteration, and on)
    state = json.loads(json.dumps(one.get_state()))
    v = hist(state)
    assert len(v.edits) == 1 and len(v.edits[0]["saved"]["weights"]) == 2 and len(v.updates) >= 2
    assert [s[3] for s in v.steps] == [2, 3, 1]
    old = as_v1(state)
    assert "history" not in old and old["edits"] and old["stream"]["updates"]

    def unsplit(s):  # (version 1 never said how ranks split their batches: "split" is this version's)
        return {**s, "history": [{k: v for k, v in e.items() if k != "split"} for e in s["history"]]}

    assert upgrade(old) == {k: v for k, v in unsplit(state).items() if k != "seal"}  # (no seal: an older position)
    a, b = (babelfeed.build_train_iterator(edited) for _ in range(2))
    a.set_state(state)
    b.set_state(old)
    assert [digest(next(a, {})) for _ in range(30)] == [digest(next(b, {})) for _ in range(30)]
    assert unsplit(a.get_state()) == unsplit(b.get_state())
    probe = babelfeed.build_train_iterator(edited)
    for s in np.random.default_rng(3).choice(np.arange(1, state["total_steps"] + 1), 6, replace=False).tolist():
        assert probe.trace(s, old) == probe.trace(s, state), s


def test_an_lm_state_of_version_1_loads(tmp_path):
    from babelfeed.lm.iterator import LMIterator

    rng = np.random.default_rng(0)
    with babelfeed.IndexedDatasetBuilder(tmp_path / "web", np.int32, format="megatron") as b:
        for _ in range(40):
            b.add_item(rng.integers(10, 1000, int(rng.integers(3, 40))))
            b.end_document()
        b.finalize()
    kw = dict(seq_len=16, global_batch=4, num_samples=40, split="100,0,0", cache_dir=tmp_path / "cache")
    it = LMIterator.build(f"1.0 {tmp_path / 'web'}", **kw)
    next(it)
    state = it.get_state()
    assert state["version"] == 3
    fresh = LMIterator.build(f"1.0 {tmp_path / 'web'}", **kw)
    fresh.set_state({**state, "version": 1})
    assert digest(next(fresh)) == digest(next(it))
    with pytest.raises(StateError, match="version 4"):
        fresh.set_state({**state, "version": 4})


def test_events_past_the_states_position_and_coerced_numbers_are_refused(root):
    """From the review: a weights event moved past the state's batch, a ranks event in a later epoch, an edit
    saved after total_steps were accepted (and changed the batches); version 1 coerced "2" and 2.9 to ints."""
    cfg = config_for(root, **SCHEDULED)
    its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=2) for r in range(2)]
    tasks = its[0].planner.sources.tasks
    for step in range(6):
        for it in its:
            next(it)
            if step == 2:
                it.set_weights({t: 1.0 + i for i, t in enumerate(tasks)})
    state = json.loads(json.dumps(its[0].get_state()))
    fresh = babelfeed.build_train_iterator(cfg, world_size=2)

    def edited(kind, **change):
        s = json.loads(json.dumps(state))
        e = next(e for e in s["history"] if e["event"] == kind)
        e.update(change)
        return s

    now = state["stream"]["batches"] + state["consumed"]
    for bad, match in ((edited("weights", batch=now + 40), "'weights' event takes effect at global batch"),
                       (edited("ranks", epoch=7), "'ranks' event counts from epoch 7"),
                       (edited("ranks", consumed=state["consumed"] + 500), "past the state's own position")):
        with pytest.raises(HistoryError, match=match):
            fresh.set_state(bad)
    old = as_v1(state)
    for field, value in (("steps", [[0, 1, 0, "2"]]), ("steps", [[0, 1, 0, 2.9]]),
                         ("weights", [["4", {t: 1.0 for t in tasks}]])):
        with pytest.raises(HistoryError, match="version-1 state's logs|history"):
            fresh.set_state({**old, field: value})
