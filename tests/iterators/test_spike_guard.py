"""babelfeed.iterators.policy.SpikeGuard: fed the loss of every step, it answers a spike (a loss that is not finite, or more
than ``threshold`` robust SDs above the median of the last ``window`` losses) with a Rollback (restore a checkpoint
``rollback`` steps back, skip the steps up to the spike), forgets the losses of the steps a rollback takes again,
refuses to roll back once more when the spike keeps coming back, and knows from a run's state the rollbacks it
recorded. End to end on synthetic data: a loop that rolls back past a poisoned batch serves exactly the batches of a
run that made the same skip at the checkpoint's step, and never the poisoned sample again."""

import dataclasses
import json
import math
import re

import numpy as np
import pytest

import babelfeed
from babelfeed.errors import BabelfeedError, HistoryError, UsageError, UsageTypeError
from babelfeed.iterators.policy import Rollback, SpikeGuard, SpikeGuardError
from synthetic import config_for, make_data_bin

DIRS = {"aaa-bbb": [600, 500], "aaa-ccc": [120, 80], "bbb-ccc": [200, 150]}
STREAM = {"mixing__sampler": "stream", "data__shards": "all", "batching__window": 150}
REASON = re.compile(r"^SpikeGuard: loss (\S+) at step (\d+), (\S+) robust SDs above the median (\S+) of the last "
                    r"(\d+) steps$")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("spike")
    make_data_bin(r, directions=DIRS)
    return r


def cfg(root):
    return config_for(root, **STREAM)


def curve(steps: int, seed: int = 7) -> np.ndarray:
    """A noisy decreasing training loss: 2 + 8 exp(-t / 300), times 1 + 2% normal noise."""
    t = np.arange(1, steps + 1)
    rng = np.random.default_rng(seed)
    return (2 + 8 * np.exp(-t / 300)) * (1 + 0.02 * rng.standard_normal(steps))


def feed(guard, losses, first: int = 1) -> list:
    """Feed ``losses`` as steps ``first``, ``first + 1``, ...; the actions returned, None dropped."""
    return [a for a in (guard.update(first + i, x) for i, x in enumerate(losses)) if a is not None]


def robust(window) -> tuple[float, float]:
    """Median and robust SD of ``window``, computed here apart from the guard."""
    w = sorted(window)
    n = len(w)
    med = (w[n // 2] + w[(n - 1) // 2]) / 2
    d = sorted(abs(x - med) for x in w)
    mad = (d[n // 2] + d[(n - 1) // 2]) / 2
    return med, max(1.4826 * mad, 1e-3 * abs(med))


def test_a_noisy_decreasing_curve_never_fires_and_a_late_spike_does():
    losses = curve(2000)
    guard = SpikeGuard()
    assert feed(guard, losses) == [] and guard.events == []
    # the noise is real: a guard three times as sensitive fires on it
    assert feed(SpikeGuard(threshold=2.0, max_rollbacks=10**6), losses)
    # +50% at step 1900
    guard = SpikeGuard()
    assert feed(guard, losses[:1899]) == []
    window = guard.window
    assert window == tuple(losses[1799:1899])
    spike = float(losses[1899] * 1.5)
    action = guard.update(1900, spike)
    assert isinstance(action, Rollback)
    assert (action.step, action.loss, action.to_step, action.skip) == (1900, spike, 1850, range(1851, 1901))
    med, sd = robust(window)
    got = REASON.match(action.reason)
    assert got, action.reason
    assert float(got[1]) == pytest.approx(spike, rel=1e-5) and int(got[2]) == 1900 and int(got[5]) == 100
    assert float(got[3]) == pytest.approx((spike - med) / sd, rel=1e-2) and (spike - med) / sd > 20
    assert float(got[4]) == pytest.approx(med, rel=1e-5)
    assert guard.events == [{"step": 1900, "loss": spike, "to_step": 1850, "skip": [1851, 1901],
                             "reason": action.reason}]
    assert action.as_dict() == guard.events[0] and json.loads(json.dumps(guard.events)) == guard.events
    with pytest.raises(dataclasses.FrozenInstanceError):  # frozen
        action.step = 3
    # skip_after and a spike within `rollback` steps of the start
    early = SpikeGuard(window=5, rollback=50, skip_after=4)
    assert feed(early, [1.0, 1.01, 0.99, 1.0, 1.02]) == []
    action = early.update(6, 5.0)
    assert (action.to_step, action.skip) == (0, range(1, 11))


def test_the_docstrings_worked_example_holds():
    ramp = [2.0, 2.1, 1.9, 2.2, 2.0]
    for last, fires in ((2.8, False), (3.0, True), (2.889, False), (2.8897, True)):
        guard = SpikeGuard(window=5, threshold=6)
        assert feed(guard, ramp) == []
        action = guard.update(6, last)
        assert (action is not None) == fires, last
    assert "(6.74 robust SDs)" in SpikeGuard.__doc__ and "2.0 + 6 * 0.14826 = 2.88956" in SpikeGuard.__doc__
    guard = SpikeGuard(window=5)
    feed(guard, ramp)
    assert "6.74 robust SDs above the median 2 " in guard.update(6, 3.0).reason
    for last, fires in ((2.0119, False), (2.0121, True), (1.0, False)):  # a flat curve: the floor, 1e-3 * 2.0
        guard = SpikeGuard(window=5)
        feed(guard, [2.0] * 5)
        assert (guard.update(6, last) is not None) == fires, last
    zeros = SpikeGuard(window=3)  # sd 0: anything above the median
    feed(zeros, [0.0, 0.0, 0.0])
    assert zeros.update(4, 0.0) is None and zeros.update(5, 1e-9) is not None
    assert "inf robust SDs" in zeros.events[0]["reason"]


def test_a_loss_that_is_not_finite_fires_even_in_the_warm_up():
    guard = SpikeGuard(rollback=2)
    assert guard.update(1, 5.0) is None and guard.update(2, 1e6) is None  # finite: the warm-up lets it be
    action = guard.update(3, float("nan"))
    assert action.step == 3 and math.isnan(action.loss) and (action.to_step, action.skip) == (1, range(2, 4))
    assert action.reason == "SpikeGuard: loss nan at step 3, not finite"
    assert guard.update(10, np.float32("inf")).reason == "SpikeGuard: loss inf at step 10, not finite"
    assert guard.update(20, np.array(-np.inf)).skip == range(19, 21)
    assert guard.window == (5.0, 1e6) and [e["step"] for e in guard.events] == [3, 10, 20]


def test_a_spikes_loss_stays_out_of_the_window_and_the_next_is_judged_against_the_same():
    guard = SpikeGuard(window=10)
    base = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98, 1.0, 1.01]
    assert feed(guard, base) == []
    first, second = guard.update(11, 9.0), guard.update(12, 9.0)  # fed without a rollback in between
    assert first is not None and second is not None
    assert REASON.match(first.reason).group(3, 4) == REASON.match(second.reason).group(3, 4)  # same SDs, same median
    assert guard.window == tuple(base)
    assert guard.update(13, 1.03) is None and guard.window == tuple(base[1:]) + (1.03,)
    assert [e["step"] for e in guard.events] == [11, 12]
    # the loss types a loop holds
    assert guard.update(14, np.float32(1.0)) is None and guard.update(np.int64(15), np.array(0.99)) is None
    assert guard.window[-2:] == (1.0, 0.99) and all(type(x) is float for x in guard.window)


def test_rolled_back_drops_the_losses_of_the_steps_taken_again():
    guard = SpikeGuard(window=5, threshold=6.0)
    assert feed(guard, [float(s) for s in range(1, 21)]) == []  # a rising line: 2 SDs each, no spike
    assert guard.window == (16.0, 17.0, 18.0, 19.0, 20.0) and guard.last_step == 20
    guard.rolled_back(12)
    assert guard.window == (8.0, 9.0, 10.0, 11.0, 12.0) and guard.last_step == 12
    straight = SpikeGuard(window=5)  # a guard that never went past 12 holds the same
    feed(straight, [float(s) for s in range(1, 13)])
    assert straight.window == guard.window
    with pytest.raises(UsageError, match="step 12 is not after the last step fed, 12"):
        guard.update(12, 12.0)
    # the steps taken again, on other data
    assert guard.update(13, 100.0).reason.endswith("above the median 10 of the last 5 steps")
    assert feed(guard, [10.5, 11.0, 11.5], first=14) == []
    assert guard.window == (10.0, 11.0, 12.0, 10.5, 11.0, 11.5)[-5:]
    assert guard.last_step == 16
    guard.rolled_back(16)  # the last step itself: nothing dropped
    assert guard.window == (11.0, 12.0, 10.5, 11.0, 11.5)
    guard.rolled_back(0)  # the run's start: a warm-up again
    assert guard.window == () and guard.update(1, 1e9) is None


def test_a_spike_that_keeps_coming_back_raises_after_max_rollbacks():
    def warm(guard, upto):
        rng = np.random.default_rng(upto)
        assert feed(guard, 1.0 + 0.01 * rng.standard_normal(upto - guard.last_step), first=guard.last_step + 1) == []

    guard = SpikeGuard(window=20, rollback=10, max_rollbacks=3)
    for spike_at in (100, 100, 98):  # each time the loop rolls back, skips, and the spike comes back
        warm(guard, spike_at - 1)
        action = guard.update(spike_at, 50.0)
        assert action is not None
        guard.rolled_back(action.to_step - 2)  # the newest checkpoint at or before to_step
    warm(guard, 102)
    with pytest.raises(SpikeGuardError, match=r"spiked at step 103 .*after 3 rollbacks for spikes within 10 steps "
                                              r"of it \(at steps 100, 100, 98; max_rollbacks=3\)") as err:
        guard.update(103, float("nan"))
    message = str(err.value)
    assert "skipping more data will not help" in message and "Lower the learning rate" in message
    assert "optimizer state" in message
    assert isinstance(err.value, BabelfeedError) and isinstance(err.value, RuntimeError)
    assert [e["step"] for e in guard.events] == [100, 100, 98]  # the refused one is not an event
    # spikes further apart than `rollback` (11 steps each: a chain, but no two within 10) never raise
    apart = SpikeGuard(window=20, rollback=10, max_rollbacks=1)
    for spike_at in (100, 111, 122, 133, 500, 900):
        warm(apart, spike_at - 1)
        assert apart.update(spike_at, 50.0) is not None
    assert len(apart.events) == 6
    with pytest.raises(SpikeGuardError, match="at steps 900"):  # max_rollbacks=1: the first that comes back
        apart.update(905, 50.0)


def test_bad_arguments_are_refused_by_name():
    for value in (0, -1.0, float("nan"), float("inf"), "6", None, True):
        with pytest.raises(UsageError, match=r"threshold must be a finite number > 0 \(robust standard deviations\), "
                                             rf"got {re.escape(repr(value))}"):
            SpikeGuard(threshold=value)
    for name, bad, smallest in (("window", 1, 2), ("window", 2.0, 2), ("window", True, 2), ("rollback", 0, 1),
                                ("rollback", "5", 1), ("skip_after", -1, 0), ("max_rollbacks", 0, 1),
                                ("max_rollbacks", 1.5, 1)):
        with pytest.raises(UsageError, match=rf"^{name} must be an integer >= {smallest}, got {re.escape(repr(bad))}$"):
            SpikeGuard(**{name: bad})
    assert SpikeGuard(threshold=np.float32(3), window=np.int64(2), skip_after=0).window_size == 2
    guard = SpikeGuard()
    for step in (0, -3, 1.0, "1", True):
        with pytest.raises(UsageError, match=rf"^step must be an integer >= 1, got {re.escape(repr(step))}$"):
            guard.update(step, 1.0)
    for loss in ("1.0", None, True, [1.0, 2.0], np.array([1.0, 2.0])):
        with pytest.raises(UsageError, match="the loss must be a real number"):
            guard.update(1, loss)
    assert guard.last_step == 0  # nothing refused was fed
    guard.update(5, 1.0)
    for step in (5, 4):
        with pytest.raises(UsageError, match=rf"step {step} is not after the last step fed, 5; .*rolled_back"):
            guard.update(step, 1.0)
    with pytest.raises(UsageError, match="rolled_back: step 6 lies after the last step fed, 5"):
        guard.rolled_back(6)
    with pytest.raises(UsageError, match="rolled_back's step must be an integer >= 0, got -1"):
        guard.rolled_back(-1)
    with pytest.raises(UsageTypeError, match="a state is a dict .*got list"):
        SpikeGuard.from_state([])
    with pytest.raises(HistoryError, match="event 0 is"):
        SpikeGuard.from_state({"version": 2, "history": [{"event": "skip", "step": 3, "reason": 4}]})
    with pytest.raises(UsageError, match="window must be an integer >= 2"):
        SpikeGuard.from_state({"version": 2, "history": []}, window=1)


def test_from_state_knows_the_rollbacks_a_state_recorded(root):
    guard = SpikeGuard(window=2, rollback=2)
    assert feed(guard, [1.0, 1.0]) == []
    action = guard.update(9, 50.0)
    assert action.skip == range(8, 10)
    it = babelfeed.build_train_iterator(cfg(root))
    for _ in range(5):
        next(it)
    it.skip(steps=action.skip, reason=action.reason)
    it.skip(steps=range(12, 14), reason="bad shard, found by hand")
    it.skip(where={"corpus": "aaa-ccc", "shard": 1}, reason="SpikeGuard: a corpus left out by hand")  # not steps
    state = json.loads(json.dumps(it.get_state()))
    again = SpikeGuard.from_state(state, rollback=2, max_rollbacks=1)
    assert again.events == guard.events == [{"step": 9, "loss": 50.0, "to_step": 7, "skip": [8, 10],
                                             "reason": action.reason}]
    assert again.window == () and again.last_step == 0
    with pytest.raises(SpikeGuardError, match="at steps 9;"):  # max_rollbacks holds across the restart
        again.update(10, float("nan"))
    assert SpikeGuard.from_state({"version": 2, "history": []}).events == []
    assert SpikeGuard.from_state(babelfeed.build_train_iterator(cfg(root)).get_state()).events == []


def leaves(batch, prefix=""):
    out = {}
    for k, v in batch.items():
        out.update(leaves(v, f"{prefix}{k}/") if isinstance(v, dict) else {prefix + k: np.asarray(v)})
    return out


def served(batch) -> set:
    return set(np.asarray(batch["id"])[np.asarray(batch["weight"]) > 0].tolist())


def steps_of(it, n: int, actions=None) -> dict:
    """``n`` training steps' batches (an epoch's end is no step); ``actions[s]`` runs before step ``s``."""
    out, done = {}, set()
    while len(out) < n:
        step = it.total_steps + 1
        if actions and step in actions and step not in done:
            actions[step](it)
            done.add(step)
        batch = next(it, None)
        if batch is not None:
            out[step] = batch
    return out


def test_a_training_loop_rolls_back_past_a_poisoned_batch(root):
    """A loop fed a loss of 1.0 (+ noise) per step, 30.0 on the step whose batch holds a poisoned sample; it
    checkpoints every 10 steps and rolls back, skips and goes on as SpikeGuard's docstring shows."""
    first = steps_of(babelfeed.build_train_iterator(cfg(root)), 240)
    seen = {}
    for step, batch in first.items():
        for i in served(batch):
            seen.setdefault(i, []).append(step)
    # a sample served at step p and at no other step up to p + 40 (epoch 1 ends at step 126: most samples of
    # epoch 2's first steps were not served in epoch 1); the skip of steps p - 49..p then spans both epochs
    poison, p = next(((i, p) for p in range(130, 201) for i in sorted(served(first[p]))
                      if [s for s in seen[i] if s <= p + 40] == [p]), (None, None))
    assert poison is not None, "no sample is served at one step only, up to 40 steps later, between 130 and 200"
    last = p + 40

    def loss(step, batch):
        if poison in served(batch):
            return 30.0
        return 1.0 + 0.01 * np.random.default_rng(step).standard_normal()

    it = babelfeed.build_train_iterator(cfg(root))
    guard = SpikeGuard()
    checkpoints = {0: json.loads(json.dumps(it.get_state()))}
    step, taken, after, restored = 0, [], {}, None
    while step < last:
        batch = next(it, None)
        if batch is None:  # an epoch's end
            continue
        step += 1
        taken.append(step)
        if restored is not None:
            after[step] = batch
        if np.asarray(batch["ntokens"]).sum() == 0:  # a skipped step: no loss, no optimizer step
            continue
        action = guard.update(step, loss(step, batch))
        if action is not None:
            restored = max(s for s in checkpoints if s <= action.to_step)
            it.set_state(json.loads(json.dumps(checkpoints[restored])))
            it.skip(steps=action.skip, reason=action.reason)
            guard.rolled_back(restored)
            checkpoints = {s: c for s, c in checkpoints.items() if s < restored}
            checkpoints[restored] = json.loads(json.dumps(it.get_state()))
            step = restored
        elif step % 10 == 0:
            checkpoints[step] = json.loads(json.dumps(it.get_state()))
    assert len(guard.events) == 1, guard.events
    event = guard.events[0]
    assert (event["step"], event["loss"], event["to_step"], event["skip"]) == (p, 30.0, p - 50, [p - 49, p + 1])
    assert restored == (p - 50) // 10 * 10 and taken == list(range(1, p + 1)) + list(range(restored + 1, last + 1))
    assert sorted(after) == list(range(restored + 1, last + 1))
    assert not any(poison in served(b) for b in after.values())
    assert all(np.asarray(after[s]["ntokens"]).sum() == 0 for s in range(p - 49, p + 1))  # the skipped steps
    # a fresh run that made the same skip at the checkpoint's step serves the same batches, leaf for leaf
    skip = lambda i: i.skip(steps=range(p - 49, p + 1), reason=event["reason"])
    ref = steps_of(babelfeed.build_train_iterator(cfg(root)), last, {restored + 1: skip})
    for s, got in after.items():
        want, have = leaves(ref[s]), leaves(got)
        assert sorted(want) == sorted(have), s
        for k in want:
            assert want[k].dtype == have[k].dtype and np.array_equal(want[k], have[k]), f"step {s}: leaf {k}"
    # and the steps that were not skipped hold what the first run served
    assert all(served(after[s]) == served(first[s]) for s in after if not p - 49 <= s <= p)
    # the state knows the rollback
    assert SpikeGuard.from_state(it.get_state()).events == guard.events
