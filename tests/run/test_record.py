"""The run record (``babelfeed.run``): every component saves and restores its own data (through JSON), refuses a
malformed one by name, and both kinds of iterator are built on the same components and the same steering."""

import json
import os

import numpy as np
import pytest

import babelfeed
import golden
from babelfeed.errors import HistoryError, StateError
from babelfeed.iterators.protocol import LoaderIterator
from babelfeed.lm.iterator import LMIterator
from babelfeed.run.edits import Edits
from babelfeed.run.layout import Layout
from babelfeed.run.ledger import Ledger
from babelfeed.run.record import RunRecord
from babelfeed.run.skips import Skips
from babelfeed.run.steps import StepLog
from babelfeed.run.weights import Weights
from synthetic import config_for, make_data_bin

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("record")
    make_data_bin(r)
    golden.make_lm_data(r)
    return r


def lm_config(root):
    c = babelfeed.load_config(os.path.join(os.path.dirname(HERE), "configs", "lm_packing.py"))
    c.data_path = f"0.4 {root}/lm/web 0.6 {root}/lm/books"
    c.seq_len, c.global_batch, c.num_samples = 24, 12, 12 * 30
    c.split, c.mode, c.cache_dir = "90,10,0", "pack", str(root / "cache")
    return c


def through_json(x):
    return json.loads(json.dumps(x))


def test_the_step_log_round_trips_and_opens_a_segment_per_world_size():
    log = StepLog(2, "batches")
    log.resume([], [], 0, 1, 0)
    log.resume(log.steps(), log.splits(), 7, 1, 14)  # the same world size: no new segment
    assert log.steps() == [[0, 1, 0, 2]]
    other = StepLog(3, "batches")
    other.set_state(through_json(log.get_state()), 7, 1, 14)
    assert other.steps() == [[0, 1, 0, 2], [7, 1, 14, 3]] and other.world_size_at(7) == 2 == other.world_size_at(5)
    assert other.world_size_at(8) == 3
    again = StepLog(3, "batches")
    again.set_state(through_json(other.get_state()), 7, 1, 14)
    assert again.get_state() == other.get_state()
    with pytest.raises(HistoryError, match="'ranks' events must come in training order"):
        StepLog.check(list(reversed(other.get_state())), 7)


def test_the_skips_round_trip_and_refuse_what_is_not_this_kind_of_runs():
    events = [{"event": "skip", "step": 3, "epoch": 1, "batch": 6, "reason": "spike", "where": {"stream": ["a"]}},
              {"event": "skip", "step": 4, "epoch": 1, "batch": 8, "reason": "", "steps": [6, 7],
               "batches": [[1, 10, 12]]}]
    skips = Skips()
    skips.set_state(through_json(events))
    again = Skips()
    again.set_state(through_json(skips.get_state()))
    assert again.get_state() == events and again.step_ranges() == [(1, 10, 12)]
    with pytest.raises(HistoryError, match="a translation run's"):
        Skips.check(events, lm=True)
    lm = [{"event": "skip", "step": 2, "sample": 24, "reason": "", "ids": [[30, 33]]}]
    with pytest.raises(HistoryError, match="past the state's consumed_samples=12"):
        Skips.check(lm, lm=True, at=12)
    with pytest.raises(HistoryError, match="skip 0 is"):
        Skips.check([{"event": "skip", "step": 2}])
    # the one engine answers an LM run's samples too
    s = Skips(lm)
    assert s.dropped_samples(np.arange(28, 36), lambda w, g: np.zeros(len(g), bool)).tolist() == \
        [False, False, True, True, True, False, False, False]


def test_the_weights_round_trip_for_both_kinds_of_run():
    w = Weights([(6, np.array([0.25, 0.75]))], [(0, 0.0, 2), (10, 5.0, 3)], ["a", "b"], counts_updates=True)
    state = through_json(w.get_state())
    assert state == {"weights": [[6, {"a": 0.25, "b": 0.75}]], "updates": [[0, 0.0, 2], [10, 5.0, 3]], "blend": []}
    assert Weights.check(state["weights"], ["a", "b"]) == [(6, [0.25, 0.75])]
    with pytest.raises(HistoryError, match="for the tasks"):
        Weights.check([[6, {"a": 1.0}]], ["a", "b"])
    blend = [{"event": "blend", "sample": 0, "weights": {"k": 1.0}, "offsets": {"k": 0}, "names": {"k": "web"}}]
    assert Weights(blend=blend).get_state()["blend"] == blend


def test_the_edits_round_trip_and_refuse_one_past_the_position():
    edits = Edits()
    event = {"step": 9, "epoch": 2, "batch": 4, "changes": {"mixing.temperature": [5.0, 1.0]}}
    edits.set_state([event], 10, (2, 6))
    again = Edits()
    again.set_state(through_json(edits.get_state()), 10, (2, 6))
    assert again.get_state() == [event]
    assert again.timeline() == [{"edit": 1, "from_step": 10, "epoch": 2, "batch": 4,
                                 "changes": {"mixing.temperature": [5.0, 1.0]}}]
    with pytest.raises(HistoryError, match="lies past the state's own position"):
        Edits().set_state([event], 8, (2, 6))


def test_the_ledger_round_trips_its_counts_and_dormant_streams():
    led = Ledger(2)
    start = np.array([[5, 1], [50, 10], [60, 12]], np.int64)
    led.dormant = {"gone": {"samples": 3, "src_tokens": 30, "tgt_tokens": 31, "rows": 9, "position": 4}}
    state = through_json(led.get_state(2, ["a", "b"], start, skipped=np.zeros((3, 2), np.int64)))
    again = Ledger(2)
    again.set_state(state, 2, ["a", "b"])
    assert np.array_equal(again.start[2], start) and again.dormant == led.dormant
    flat = again.report(start, ["a", "b"], np.array([10, 4]), 2, 7)
    assert flat["ledger/gone/samples"] == 3 and flat["ledger/samples"] == 9 and flat["ledger/a/passes"] == 0
    with pytest.raises(StateError, match="'dormant' holds 'x'"):
        Ledger(2).check({"dormant": {"x": {"samples": -1}}})


def test_the_layout_round_trips_keeps_ids_across_an_edit_and_refuses_overlaps(root):
    """An edited run's numbering survives JSON; a new stream goes after the old ones and a new shard's ids after the
    last id used; a layout whose shards overlap, or that lacks a stream of the config, is refused by name."""
    it = babelfeed.build_train_iterator(config_for(root))
    plain = Layout.plain(it.planner)
    back = Layout.from_state(through_json(plain.get_state()), it.planner)
    assert back.get_state() == plain.get_state() and back.is_plain(it.planner)
    fewer = babelfeed.build_train_iterator(config_for(root, data__directions=",".join(it.planner.keys[1:])))
    kept = Layout.plain(fewer.planner).extended(it.planner)
    assert kept.streams[-1] == it.planner.keys[0] and not kept.is_plain(it.planner)
    first = kept.shards[f"{it.planner.keys[0]}\t0"][0]
    assert first >= Layout.plain(fewer.planner).next  # ids of the added stream come after every id used
    assert Layout.from_state(through_json(kept.get_state()), it.planner).get_state() == kept.get_state()
    overlap = through_json(kept.get_state())
    a, b = list(overlap["shards"])[:2]
    overlap["shards"][b][0] = overlap["shards"][a][0]
    with pytest.raises(StateError, match="overlap"):
        Layout.from_state(overlap, it.planner)
    with pytest.raises(StateError, match="lacks or miscounts"):
        Layout.from_state(through_json(Layout.plain(fewer.planner).get_state()), it.planner)


def test_the_record_composes_the_state_of_both_kinds(root):
    t = babelfeed.build_train_iterator(config_for(root), world_size=2)
    lm = babelfeed.build_iterator(lm_config(root), world_size=2)
    for it in (t, lm):
        next(it)
        state = through_json(it.get_state())
        assert state["version"] == 3 and state["kind"] == it.kind and state["name"] == "train"
        views = RunRecord.read(state)
        assert views.steps == [[0, 1, 0, 2]]
        it.skip(steps=range(3, 4), reason="why")
        fresh = babelfeed.build_iterator(lm_config(root) if it.kind == "lm" else config_for(root), world_size=2)
        fresh.set_state(it.get_state())
        assert fresh.get_state() == it.get_state()
    record = RunRecord("translation", "train", 1, "batches")
    with pytest.raises(StateError, match="state of a lm iterator"):
        record.check({**state, "kind": "lm"}, {"epoch": 1})
    with pytest.raises(StateError, match="field 'kind' must be one of"):
        record.check({**state, "kind": "mt"}, {"epoch": 1})


def test_both_iterators_hold_the_same_components_and_the_protocol_defines_the_steering_once(root):
    """The translation and LM iterators call the same component classes for skips, edits, weights, the ledger
    and the state, and neither defines skip, set_weights, edit, ledger or trace of its own."""
    t = babelfeed.build_train_iterator(config_for(root))
    lm = babelfeed.build_iterator(lm_config(root))
    for name in ("steps", "skips", "edits", "ledger", "weights"):
        assert type(getattr(t.record, name)) is type(getattr(lm.record, name)), name
    assert type(t.record) is type(lm.record) is RunRecord
    for method in ("skip", "set_weights", "edit", "ledger", "trace", "get_state", "set_state", "describe_ids",
                   "batch_for_step"):
        assert hasattr(LoaderIterator, method), method
    for method in ("skip", "set_weights", "edit", "ledger", "trace"):
        assert getattr(type(t), method) is getattr(LoaderIterator, method) is getattr(LMIterator, method), method
    with pytest.raises(TypeError, match="abstract"):  # not babelfeed's: Python refuses an abstract class
        LoaderIterator(0, 1, "batches")
    assert isinstance(t, LoaderIterator) and isinstance(lm, LoaderIterator)
