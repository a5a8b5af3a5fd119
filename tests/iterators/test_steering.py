"""Steering a run: set_weights changes the mixture from the next planning window, is recorded in the state, and a
run killed and resumed at random points (in a fresh process, before or after a change) is bit-identical to one
never stopped."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import babelfeed
from golden import digest
from synthetic import config_for, make_data_bin
from helpers import as_v1, hist
from babelfeed.errors import HistoryError, StateError, StateMismatch, UsageError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helpers are
STREAM = {"mixing__sampler": "stream", "data__shards": "all", "batching__window": 200}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("steer")
    make_data_bin(r)
    return r


def lockstep(its, steps: int, changes: dict, start: int = 0) -> list:
    """Every rank's batch digests, step by step (epoch ends skipped), calling set_weights on every rank before
    the steps named in ``changes``."""
    out, step = [], start
    while step < start + steps:
        if step in changes:
            for it in its:
                it.set_weights(changes[step])
        batches = [next(it, None) for it in its]
        if batches[0] is None:
            assert all(b is None for b in batches)
            continue
        out.append([digest(b) for b in batches])
        step += 1
    return out


def random_changes(rng, tasks, steps: int) -> dict:
    at = sorted(rng.choice(np.arange(1, steps), 3, replace=False).tolist())
    return {int(s): {t: float(rng.choice([0.0, 0.2, 1.0, 4.0])) if i else 1.0 for i, t in enumerate(tasks)}
            for s in at}


CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import babelfeed
from synthetic import config_for
from test_steering import STREAM, lockstep

world, state, start, steps, changes = json.loads(sys.argv[3])
cfg = config_for(sys.argv[2], **STREAM)
its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=world) for r in range(world)]
for it in its:
    it.set_state(state)
print(json.dumps(lockstep(its, steps, {int(k): v for k, v in changes.items()}, start)))
"""


def test_weight_changes_resume_bit_identically_at_random_points(root, tmp_path):
    """Three changes at random steps over 2.5 epochs on 2 ranks; the run is cut at random points (before, at and
    after changes) and resumed in a fresh process: every rank's every batch equals the uninterrupted run's, and
    the changes moved the mixture (the runs differ from one without them)."""
    cfg = config_for(root, **STREAM)
    world = 2
    its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=world) for r in range(world)]
    tasks = its[0].planner.sources.tasks
    steps = int(2.5 * len(its[0]))
    rng = np.random.default_rng(17)
    changes = random_changes(rng, tasks, steps)
    whole = lockstep(its, steps, changes)
    plain = lockstep([babelfeed.build_train_iterator(cfg, rank=r, world_size=world) for r in range(world)], steps, {})
    first = min(changes)
    assert whole[:first] == plain[:first] and whole != plain
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    cuts = sorted({first, first + 1, *rng.choice(np.arange(1, steps - 1), 3, replace=False).tolist()})
    for cut in cuts:
        its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=world) for r in range(world)]
        head = lockstep(its, cut, changes)
        state = its[0].get_state()
        assert all(it.get_state() == state for it in its)
        assert len(hist(state).weights) == sum(1 for s in changes if s < cut)
        rest = {s: w for s, w in changes.items() if s >= cut}
        out = subprocess.run([sys.executable, str(script), HERE, str(root),
                              json.dumps([world, state, cut, steps - cut, rest])],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        tail = json.loads(out.stdout.strip().splitlines()[-1])
        assert len(head) + len(tail) == steps and head + tail == whole, cut


def test_a_change_moves_the_mixture_from_the_next_window(root):
    """A task's weight set to 0 mid-window: the window being served keeps its mix, and from the next window on
    the task's streams are not drawn; the ledger and task_stats follow."""
    cfg = config_for(root, **STREAM)
    it = babelfeed.build_train_iterator(cfg)
    tasks = it.planner.sources.tasks
    planner = it.planner
    for _ in range(3):
        next(it)
    epoch, consumed = it.epoch, it.consumed
    w, j = planner.locate(epoch, consumed)
    assert j > 0  # mid-window
    before = planner.window(epoch, w).samples.direction.copy()
    it.set_weights({t: (0.0 if t == tasks[-1] else 1.0) for t in tasks})
    dead = tasks.index(tasks[-1])
    assert np.array_equal(planner.window(epoch, w).samples.direction, before)  # the window being served: as it was
    assert (before == dead).any()
    nxt = planner.window(epoch, w + 1).samples.direction
    assert len(nxt) and not (nxt == dead).any()
    assert it.task_stats()[tasks[-1]]["probability"] > 0  # "now": the window being served
    while planner.locate(it.epoch, it.consumed)[0] == w:
        next(it)
    assert it.task_stats()[tasks[-1]]["probability"] == 0.0


def test_set_weights_refuses_what_it_cannot_do(root):
    it = babelfeed.build_train_iterator(config_for(root, mixing__sampler="fairseq"))
    tasks = it.planner.sources.tasks
    with pytest.raises(StateMismatch, match="fairseq-compatible sampling .* draws each epoch as fairseq does.*keep_position"):
        it.set_weights({t: 1.0 for t in tasks})
    it = babelfeed.build_train_iterator(config_for(root, **STREAM))
    with pytest.raises(UsageError, match="for every task"):
        it.set_weights({tasks[0]: 1.0})
    with pytest.raises(UsageError, match="numbers >= 0"):
        it.set_weights({t: -1.0 for t in tasks})
    with pytest.raises(UsageError, match="not all 0"):
        it.set_weights({t: 0.0 for t in tasks})
    next(it)
    it.set_weights({t: 1.0 for t in tasks})
    state = it.get_state()
    fresh = babelfeed.build_train_iterator(config_for(root, **STREAM))
    with pytest.raises(HistoryError, match="holds the weight change"):
        fresh.set_state({**state, "history": [{**e, "weights": {tasks[0]: 1.0}} if e["event"] == "weights" else e
                                              for e in state["history"]]})
    with pytest.raises(HistoryError, match="holds the weight change"):  # the same, as an older babelfeed wrote it
        fresh.set_state({**as_v1(state), "weights": [[0, {tasks[0]: 1.0}]]})


def test_the_torch_read_ahead_applies_a_change_where_the_loop_stands(root):
    """TorchBatches reads ahead on a thread: set_weights there drops the read-ahead and applies the change at
    the last batch handed out, so the batches equal the plain iterator's with the same change."""
    pytest.importorskip("torch")
    from babelfeed.adapters.torch import TorchBatches

    cfg = config_for(root, **STREAM)
    tasks = babelfeed.build_train_iterator(cfg).planner.sources.tasks
    change = {t: (3.0 if t == tasks[-1] else 1.0) for t in tasks}
    plain = babelfeed.build_train_iterator(cfg)
    want = lockstep([plain], 30, {7: change})
    tb = TorchBatches(babelfeed.build_train_iterator(cfg), device="cpu", prefetch=4)
    got = []
    while len(got) < 30:
        if len(got) == 7:
            tb.set_weights(change)
        b = next(tb, None)
        if b is not None:
            got.append([digest({k: (v.numpy() if hasattr(v, "numpy") else
                                    {kk: vv.numpy() for kk, vv in v.items()} if isinstance(v, dict) else v)
                                for k, v in b.items()})])
    tb.close()
    assert got == want
    assert hist(tb.get_state()).weights == hist(plain.get_state()).weights


SCHEDULED = dict(STREAM, mixing__schedule__boundaries="6,14", mixing__schedule__mode="step",
                 mixing__schedule__weights="aaa-bbb:1,aaa-ccc:0,aaa-ddd:1 | aaa-bbb:1,aaa-ccc:1,aaa-ddd:0 | "
                                           "aaa-bbb:0,aaa-ccc:1,aaa-ddd:1",
                 batching__accumulation=2)

ELASTIC = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import babelfeed
from golden import digest
from synthetic import config_for
from test_steering import SCHEDULED

world, state = json.loads(sys.argv[3])
cfg = config_for(sys.argv[2], **SCHEDULED)
its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=world) for r in range(world)]
for it in its:
    it.set_state(state)
p = its[0].planner
start = p.epoch_start(its[0].epoch)[1] + its[0].consumed
batches, ids, updates = [], [], []
while its[0].epoch < 3:
    step = [next(it, None) for it in its]
    if step[0] is None:
        continue
    for b in step:
        if b["nsentences"] or b["id"].min() >= 0:
            batches.append(digest(b))
            ids += b["id"][b["weight"] > 0].tolist()
    updates.append([p.epoch_start(its[0].epoch)[1] + its[0].consumed, its[0].update()])
print(json.dumps({"start": start, "segments": p.update_segments, "batches": batches, "ids": ids,
                  "updates": updates, "end": p.epoch_start(3)[0].tolist(), "state": its[0].get_state()}))
"""


def test_a_scheduled_run_resumes_on_another_world_size(root, tmp_path):
    """A step schedule counted in optimizer updates (accumulation 2), saved on 2 ranks mid-epoch and resumed on 3
    (and 3 -> 1) in a fresh process: the window in progress finishes as planned (the global batches up to its end
    equal the uninterrupted run's), from the next window an update is the new world size's batches (the update
    count goes on from where it stood), and per stream, the rows served over both runs plus those the length
    filter dropped are exactly the stream's sequence up to where it stands at the end of epoch 2."""
    cfg = config_for(root, **SCHEDULED)
    script = tmp_path / "elastic.py"
    script.write_text(ELASTIC)
    rng = np.random.default_rng(5)
    for w, w2 in ((2, 3), (3, 1)):
        its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=w) for r in range(w)]
        planner = its[0].planner
        steps = int(rng.integers(2, len(its[0]) - 2))
        head, head_ids, taken = [], [], 0
        while taken < steps:
            step = [next(it) for it in its]
            taken += 1
            for b in step:
                if b["nsentences"] or b["id"].min() >= 0:
                    head.append(digest(b))
                    head_ids += b["id"][b["weight"] > 0].tolist()
        state = its[0].get_state()
        assert hist(state).updates == [[0, 0.0, 2 * w]]
        uninterrupted = list(head)
        while its[0].epoch < 2:  # the same run, on: its global batches to compare the window in progress with
            step = [next(it, None) for it in its]
            uninterrupted += [digest(b) for b in step if b is not None and (b["nsentences"] or b["id"].min() >= 0)]
        out = subprocess.run([sys.executable, str(script), HERE, str(root), json.dumps([w2, state])],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        (b0, u0, p0), (b1, u1, p1) = got["segments"]
        assert (b0, u0, p0) == (0, 0.0, 2 * w) and p1 == 2 * w2 and got["start"] <= b1
        assert u1 == pytest.approx(b1 / (2 * w))
        first_window = b1 - got["start"]  # global batches of the window in progress, still as planned
        assert got["batches"][:first_window] == uninterrupted[len(head):len(head) + first_window]
        for at, update in got["updates"]:
            expect = at / (2 * w) if at < b1 else u1 + (at - b1) / (2 * w2)
            assert update == pytest.approx(expect), (at, b1)
        assert hist(got["state"]).updates == [[b0, u0, p0], [b1, u1, p1]]
        # per stream: served + filtered == the stream's own sequence up to its position at the end of epoch 2
        it = babelfeed.build_train_iterator(cfg)
        served = it.describe_ids(head_ids + got["ids"])
        setup = it.planner.setup(1)
        comps = it.planner.sources.components
        for d, key in enumerate(it.planner.keys):
            first = next(i for i, c in enumerate(comps) if c.key == key)
            mine = sorted(s["row"] + sum(len(c) for c in comps[first:first + s["shard"]]) for s in served
                          if s["stream"] == key)
            from babelfeed.plan.mixing import stream_rows

            n = got["end"][d]
            seq = stream_rows(setup.draws, np.full(n, d, np.int32), np.arange(n)).tolist()
            left = list(seq)
            for r in mine:
                left.remove(r)  # raises if served more often than the sequence holds it
            lengths = np.concatenate([np.maximum(c.src.sizes + len(c.src_prefix), c.tgt.sizes + len(c.tgt_prefix))
                                      for c in comps if c.key == key])
            assert all(lengths[r] > 128 for r in left), (key, left[:5])


def test_a_dataloader_resumes_a_schedule_on_another_world_size(root):
    """BatchLoader saves the run's whole state, which records how schedule updates were counted, so a scheduled
    run saved through it on 2 ranks resumes on 3 with the batches the in-process iterators serve from the same
    state; an older babelfeed's bare position (no update count) from another world size is refused by name."""
    pytest.importorskip("torch")
    from babelfeed.adapters.torch import BatchLoader

    cfg = config_for(root, **SCHEDULED)
    loader = BatchLoader(cfg, rank=0, world_size=2)
    batches = iter(loader)
    for _ in range(5):
        next(batches)
    state = json.loads(json.dumps(loader.state_dict()))
    assert hist(state).updates == [[0, 0, 4]] and state["consumed"] == 10
    inproc = [babelfeed.build_train_iterator(cfg, rank=r, world_size=3) for r in range(3)]
    for r, it in enumerate(inproc):
        it.set_state(state)
        resumed = BatchLoader(cfg, rank=r, world_size=3)
        resumed.load_state_dict(state)
        def as_numpy(b):
            return {k: as_numpy(v) for k, v in b.items()} if isinstance(b, dict) else (
                b.numpy() if hasattr(b, "numpy") else b)

        got = [digest(as_numpy(b)) for b, _ in zip(resumed, range(12))]
        assert got == [digest(next(it)) for _ in range(12)], r
    legacy = {"epoch": 1, "consumed": 10, "fingerprint": state["fingerprint"], "batches_per_update": 4}
    BatchLoader(cfg, rank=1, world_size=2).load_state_dict(legacy)
    with pytest.raises(StateError, match="an optimizer update was 4 global batches"):
        BatchLoader(cfg, rank=0, world_size=3).load_state_dict(legacy)


def test_a_state_written_before_updates_were_recorded_still_resumes(root):
    """Before states recorded how updates were counted, a scheduled run's fingerprint held its batches per
    update and its state had no stream['updates']: such a state resumes, on the same count, to the same batches."""
    cfg = config_for(root, **SCHEDULED)
    it = babelfeed.build_train_iterator(cfg, world_size=2)
    for _ in range(5):
        next(it)
    state = it.get_state()
    want = [digest(next(it)) for _ in range(8)]
    old = {**as_v1(state), "fingerprint": it.planner.fingerprint(legacy=True),
           "stream": {k: v for k, v in state["stream"].items() if k != "updates"}}
    assert old["fingerprint"] != state["fingerprint"]
    fresh = babelfeed.build_train_iterator(cfg, world_size=2)
    fresh.set_state(old)
    assert [digest(next(fresh)) for _ in range(8)] == want


EDITS = [dict(data__directions="aaa-bbb,aaa-ccc"),                                   # the run starts with two
         dict(data__directions="all", mixing__temperature=1.5),                      # a corpus added, T changed
         dict(data__directions="aaa-bbb,aaa-ddd", mixing__temperature=1.5),          # one removed
         dict(data__directions="all", mixing__temperature=3.0)]                      # and added back

SEGMENT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import babelfeed
from synthetic import config_for
from test_steering import STREAM, EDITS

edit, world, state, steps = json.loads(sys.argv[3])
cfg = config_for(sys.argv[2], **STREAM, **EDITS[edit])
its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=world) for r in range(world)]
if state is not None:
    for it in its:
        it.set_state(state, mixture_change="allow")
served, taken, epoch = [], 0, its[0].epoch
while True:
    if steps is not None and taken == steps:
        break
    batches = [next(it, None) for it in its]
    if batches[0] is None:
        if steps is None:  # the last segment runs to an epoch's end: every stream at an exact position
            break
        continue
    taken += 1
    for b in batches:
        real = b["weight"] > 0
        for d in its[0].describe_ids(b["id"][real]):
            served.append([d["stream"], d["shard"], d["row"]])
state = its[0].get_state()
assert all(it.get_state() == state for it in its)
print(json.dumps({"served": served, "state": state, "edits": its[0].record.edits.events}))
"""


def test_mixture_edits_on_resume_lose_and_repeat_nothing(root, tmp_path):
    """A run edited three times (a corpus added and the temperature changed, one removed, it added back), each
    segment in a fresh process and cut at a random step (mid-window), on 2 then 3 then 1 then 2 ranks: per
    stream, the rows served over all segments are exactly the stream's own sequence up to where it stands (a
    removed stream keeps its position and goes on from it when added back); the edits are in the state."""
    script = tmp_path / "segment.py"
    script.write_text(SEGMENT)
    rng = np.random.default_rng(23)

    def segment(edit, world, state, steps):
        out = subprocess.run([sys.executable, str(script), HERE, str(root), json.dumps([edit, world, state, steps])],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    served, state = [], None
    for edit, world in zip(range(4), (2, 3, 1, 2)):
        last = edit == 3
        got = segment(edit, world, state, None if last else int(rng.integers(5, 40)))
        served += got["served"]
        state = got["state"]
    edits = hist(state).edits
    assert [e["epoch"] for e in edits] == sorted(e["epoch"] for e in edits) and len(edits) == 3
    assert edits[0]["changes"]["data.directions"] == ["aaa-bbb,aaa-ccc", "all"]
    assert edits[0]["changes"]["mixing.temperature"] == [5.0, 1.5]
    full = babelfeed.build_train_iterator(config_for(root, **STREAM))
    keys = full.planner.keys
    setup = full.planner.setup(1)
    comps = full.planner.sources.components
    final = dict(zip(state["stream"]["keys"], state["stream"]["positions"]))
    assert set(final) == set(keys) and state["epoch"] >= 2 and state["consumed"] == 0
    from babelfeed.plan.mixing import stream_rows

    for d, key in enumerate(keys):
        shard_start = {c.shard: sum(len(x) for x in comps if x.key == key and x.shard < c.shard)
                       for c in comps if c.key == key}
        mine = sorted(shard_start[s] + r for k, s, r in served if k == key)
        n = final[key]
        want = sorted(stream_rows(setup.draws, np.full(n, d, np.int32), np.arange(n)).tolist())
        assert n > 0 and mine == want, (key, n, len(mine))


def test_an_edit_that_changes_a_streams_data_or_the_seed_is_refused_by_name(root, tmp_path):
    it = babelfeed.build_train_iterator(config_for(root, **STREAM, **EDITS[0]))
    for _ in range(3):
        next(it)
    state = it.get_state()
    other = tmp_path / "other"
    make_data_bin(other, seed=4)  # the same stream names over other sentences
    moved = babelfeed.build_train_iterator(config_for(other, **STREAM, **EDITS[1]))
    with pytest.raises(StateMismatch, match=r"the data of stream\(s\) \['aaa-bbb', 'aaa-ccc'\] changed"):
        moved.set_state(state, mixture_change="allow")
    reseeded = babelfeed.build_train_iterator(config_for(root, **STREAM, **EDITS[1], seed=9))
    with pytest.raises(StateMismatch, match="the seed changed"):
        reseeded.set_state(state, mixture_change="allow")
    with pytest.raises(StateMismatch, match="mixture_change='allow'"):  # without it: refused, and told how
        babelfeed.build_train_iterator(config_for(root, **STREAM, **EDITS[1])).set_state(state)
    edited = babelfeed.build_train_iterator(config_for(root, **STREAM, **EDITS[1]))
    with pytest.raises(StateError, match=r"field 'data' must map"):
        edited.set_state({**state, "data": "garbage"}, mixture_change="allow")
    with pytest.raises(StateError, match="not a whole config of the run"):
        edited.set_state({**state, "config": {"seed": 1}}, mixture_change="allow")
    legacy = {k: v for k, v in state.items() if k != "config"}
    with pytest.raises(StateError, match="carries no config of its run"):
        babelfeed.build_train_iterator(config_for(root, **STREAM, **EDITS[1])).set_state(legacy, mixture_change="allow")
    with pytest.raises(UsageError, match="mixture_change must be"):
        it.set_state(state, mixture_change="yes")


def test_trace_after_an_edit_counts_steps_from_the_edited_mixture(root):
    """After an edited resume, trace(step) names the samples the ranks served at that step: steps after the edit
    (which takes effect at the next step, step 10) and the steps before it (from the latest state)."""
    world = 2
    its = [babelfeed.build_train_iterator(config_for(root, **STREAM, **EDITS[0]), rank=r, world_size=world)
           for r in range(world)]
    by_step = {}
    for s in range(1, 10):
        by_step[s] = [sorted(b["id"][b["weight"] > 0].tolist()) for b in (next(it) for it in its)]
    state = its[0].get_state()
    cfg = config_for(root, **STREAM, **EDITS[1])
    its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=world) for r in range(world)]
    for it in its:
        it.set_state(state, mixture_change="allow")
    step = 9
    while len(by_step) < 34:
        batches = [next(it, None) for it in its]
        if batches[0] is None:
            continue
        step += 1
        by_step[step] = [sorted(b["id"][b["weight"] > 0].tolist()) for b in batches]
    later = its[0].get_state()
    edit = hist(later).edits[-1]
    assert (edit["step"], edit["epoch"]) == (9, 1)  # after step 9 (mid-window), from global batch 18 of epoch 1
    probe = babelfeed.build_train_iterator(cfg, world_size=world)
    for s in range(1, step + 1):
        rows = probe.trace(s, later)
        assert [sorted(r["id"] for r in rows if r["rank"] == k) for k in range(world)] == by_step[s], s


def test_an_exponentiated_gradient_policy_moves_weight_to_the_high_loss_task(root):
    """The policy's weights follow exp(eta * loss), normalised and floored; fed to set_weights every 10 steps
    with one task's loss held high, that task's share of the served samples grows, and the policy built from a
    state continues from the last weights the state recorded."""
    from babelfeed.iterators.policy import ExponentiatedGradient

    p = ExponentiatedGradient(["a", "b"], eta=1.0, floor=0.0)
    w = p.update({"a": 1.0, "b": 2.0})
    assert w["b"] / w["a"] == pytest.approx(np.e)
    assert p.update({"a": 1.0})["b"] / p.weights["a"] == pytest.approx(np.e)  # b as the mean: unchanged ratio
    floored = ExponentiatedGradient(["a", "b"], eta=50.0, floor=0.1).update({"a": 0.0, "b": 10.0})
    assert floored["a"] == pytest.approx(0.05)
    with pytest.raises(UsageError, match="not among"):
        p.update({"c": 1.0})
    with pytest.raises(UsageError, match="finite"):
        p.update({"a": float("nan")})

    it = babelfeed.build_train_iterator(config_for(root, **STREAM))
    tasks = it.planner.sources.tasks
    hard = tasks[0]
    policy = ExponentiatedGradient(tasks, eta=1.0)
    shares = []
    for step in range(1, 121):
        b = next(it, None) or next(it)
        real = b["weight"] > 0
        shares.append(np.mean(np.asarray(b["direction"])[real] == tasks.index(hard)))
        if step % 10 == 0:
            it.set_weights(policy.update({t: (3.0 if t == hard else 1.0) for t in tasks}))
    assert np.mean(shares[-30:]) > np.mean(shares[:20]) + 0.2, (np.mean(shares[:20]), np.mean(shares[-30:]))
    again = ExponentiatedGradient.from_state(tasks, it.get_state(), eta=1.0)
    assert again.weights == pytest.approx(policy.weights)


def test_a_change_at_an_epochs_last_batch_takes_effect_with_the_next_epoch(root):
    """set_weights when the epoch's last step has been taken (the end of its last window): the next epoch starts
    where the streams stood and mixes with the new weights; a run resumed from the state is identical."""
    cfg = config_for(root, **STREAM)
    it = babelfeed.build_train_iterator(cfg)
    tasks = it.planner.sources.tasks
    n = len(it)
    for _ in range(n):
        next(it)
    change = {t: (5.0 if t == tasks[0] else 1.0) for t in tasks}
    it.set_weights(change)
    state = it.get_state()
    with pytest.raises(StopIteration):
        next(it)
    got = [digest(next(it)) for _ in range(12)]
    fresh = babelfeed.build_train_iterator(cfg)
    fresh.set_state(json.loads(json.dumps(state)))
    assert [digest(next(fresh)) for _ in range(12)] == got
    plain = babelfeed.build_train_iterator(cfg)
    for _ in range(n):
        next(plain)
    next(plain, None)
    assert [digest(next(plain)) for _ in range(12)] != got  # the weights did change epoch 2


def test_trace_knows_which_world_size_took_each_step(root, tmp_path):
    """A run on 2 ranks resumed on 3: trace(step, state) names the samples of steps on either side, whatever the
    world size of the iterator asked (the state says which world size took each step; it used to answer with
    other batches); trace(step, state) leaves the iterator where it was."""
    cfg = config_for(root, **STREAM)
    by_step, step = {}, 0

    def serve(its, n):
        nonlocal step
        while n:
            batches = [next(it, None) for it in its]
            if batches[0] is None:
                continue
            step += 1
            n -= 1
            by_step[step] = [sorted(b["id"][b["weight"] > 0].tolist()) for b in batches]

    two = [babelfeed.build_train_iterator(cfg, rank=r, world_size=2) for r in range(2)]
    serve(two, 11)
    s1 = two[0].get_state()
    assert hist(s1).steps == [[0, 1, 0, 2]]
    three = [babelfeed.build_train_iterator(cfg, rank=r, world_size=3) for r in range(3)]
    for it in three:
        it.set_state(json.loads(json.dumps(s1)))
    serve(three, 40)
    s2 = three[0].get_state()
    assert hist(s2).steps == [[0, 1, 0, 2], [11, s1["epoch"], s1["consumed"], 3]]
    probe = {w: babelfeed.build_train_iterator(cfg, world_size=w) for w in (1, 2, 3)}
    for s in (1, 7, 11, 12, 30, 51):
        world = 2 if s <= 11 else 3
        rows = probe[world].trace(s, s2)
        assert [sorted(r["id"] for r in rows if r["rank"] == k) for k in range(world)] == by_step[s], s
        for other in {1, 2, 3} - {world}:  # a probe of another world size answers the same: the state says
            assert probe[other].trace(s, s2) == rows, (s, other)
    # the resumed iterator's own count, without a state
    assert [sorted(r["id"] for r in three[0].trace(30) if r["rank"] == k) for k in range(3)] == by_step[30]
    # trace(step, state) leaves the iterator's position alone
    twin = babelfeed.build_train_iterator(cfg, rank=0, world_size=3)
    twin.set_state(three[0].get_state())
    three[0].trace(30, s2)
    for _ in range(3):
        assert digest(next(three[0])) == digest(next(twin))
    # the command takes the world size from the state
    state_file = tmp_path / "s2.json"
    state_file.write_text(json.dumps(s2))
    cfg_file = tmp_path / "cfg.py"
    cfg_file.write_text(f"import sys\nsys.path.insert(0, {HERE!r})\nfrom synthetic import config_for\n"
                        f"from test_steering import STREAM\n"
                        f"def get_config():\n    return config_for({str(root)!r}, **STREAM)\n")
    for s, world in ((5, 2), (40, 3)):
        out = subprocess.run([sys.executable, "-m", "babelfeed.cli", "trace", str(cfg_file), "--state",
                              str(state_file), "--step", str(s), "--json"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)
        assert [sorted(r["id"] for r in rows if r["rank"] == k) for k in range(world)] == by_step[s]


def test_the_ledger_never_goes_down_when_an_edit_removes_a_stream(root):
    """Resumed with a stream removed: the ledger at the edit is the saved run's (the removed stream's counts kept,
    as its dormant entry), and from the next step on the totals only grow while the removed stream's stay."""
    it = babelfeed.build_train_iterator(config_for(root, **STREAM, **EDITS[1]))
    for _ in range(7):
        next(it)
    state = it.get_state()
    before = it.ledger()
    removed = [k for k in it.planner.keys if k not in ("aaa-bbb", "aaa-ddd")]
    assert removed
    edited = babelfeed.build_train_iterator(config_for(root, **STREAM, **EDITS[2]))
    edited.set_state(state, mixture_change="allow")
    at_edit = edited.ledger()
    assert {k: v for k, v in at_edit.items() if k != "ledger/step"} == \
        {k: v for k, v in before.items() if k != "ledger/step"}
    last = at_edit
    for _ in range(30):
        if next(edited, None) is None:
            continue
        led = edited.ledger()
        assert led["ledger/samples"] > last["ledger/samples"] and led["ledger/tokens"] > last["ledger/tokens"]
        for k in removed:
            assert led[f"ledger/{k}/samples"] == before[f"ledger/{k}/samples"]
        last = led
    for k in removed:
        assert last[f"ledger/{k}/samples"] == edited.record.ledger.dormant[k]["samples"] > 0


def test_weights_and_states_refuse_what_is_wrong_by_name(root):
    """numpy scalars are numbers; huge weights are scaled, not overflowed; malformed dormant, edits and steps
    fields and a policy state with unusable weights are refused naming the field."""
    it = babelfeed.build_train_iterator(config_for(root, **STREAM))
    tasks = it.planner.sources.tasks
    it.set_weights({t: np.float32(0.5) if i else np.int64(2) for i, t in enumerate(tasks)})
    it.set_weights({t: 1e308 for t in tasks})
    assert next(it)["id"].size
    with pytest.raises(UsageError, match="finite numbers >= 0"):
        it.set_weights({t: float("inf") for t in tasks})
    policy = babelfeed.iterators.policy.ExponentiatedGradient(tasks)
    w = policy.update({t: np.float32(i) for i, t in enumerate(tasks)})
    assert w[tasks[-1]] > w[tasks[0]]
    with pytest.raises(StateError, match="last weights"):
        babelfeed.iterators.policy.ExponentiatedGradient.from_state(tasks, {"version": 2, "history": [
            {"event": "weights", "batch": 3, "weights": {t: 0.0 for t in tasks}}]})
    state = it.get_state()
    fresh = babelfeed.build_train_iterator(config_for(root, **STREAM))
    for field, value, match in (("dormant", {"zzz": 5}, "field 'dormant' holds 'zzz'"),
                                ("dormant", {"zzz": {"position": 5}}, "field 'dormant' holds 'zzz'"),
                                ("history", "x", "field 'history' must be a list"),
                                ("history", [{"event": "edit", "step": "a"}], "event 0 is .* it must be {'event': 'edit'"),
                                ("history", [{"event": "ranks", "step": 0, "epoch": 1, "consumed": 0, "world_size": 0}],
                                 "event 0 is .*'world_size': int >= 1"),
                                ("history", [{"event": "spike"}], "event 0 is .* an event of the kinds"),
                                ("history", [{"event": "ranks", "step": 5, "epoch": 1, "consumed": 0, "world_size": 1},
                                             {"event": "ranks", "step": 2, "epoch": 1, "consumed": 0, "world_size": 2}],
                                 "must come in training order")):
        with pytest.raises(StateError, match=match):
            fresh.set_state({**state, field: value})
    v1 = as_v1(state)  # an older babelfeed's logs, malformed: refused when upgraded, naming them
    for field, value in (("edits", "x"), ("edits", [{"step": "a"}]), ("steps", [[0, 1, 0, 0]]), ("steps", "x")):
        with pytest.raises(HistoryError, match="history|version-1 state's logs"):
            fresh.set_state({**v1, field: value})


def test_a_scheduled_run_resumed_twice_before_its_next_window_keeps_one_count(root):
    """Saved on 2 ranks mid-window, resumed on 3 and saved before the next window mark, then resumed on 1: the
    state restores (two update counts from one mark were refused as not increasing) and the batches are those
    of a resume on 1 rank straight from the first state: a count that never took effect changes nothing."""
    cfg = config_for(root, **SCHEDULED)
    its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=2) for r in range(2)]
    for _ in range(3):
        for it in its:
            next(it)
    s1 = json.loads(json.dumps(its[0].get_state()))
    three = babelfeed.build_train_iterator(cfg, rank=0, world_size=3)
    three.set_state(s1)
    s2 = json.loads(json.dumps(three.get_state()))
    starts = [u[0] for u in hist(s2).updates]
    assert starts == sorted(set(starts))
    one, direct = (babelfeed.build_train_iterator(cfg, world_size=1) for _ in range(2))
    one.set_state(s2)
    direct.set_state(s1)
    for _ in range(30):
        assert digest(next(one)) == digest(next(direct))
    assert hist(one.get_state()).updates == hist(direct.get_state()).updates
    # a state an earlier babelfeed wrote with two counts from one mark: the last one counts
    old = as_v1(s2)
    dup = {**old, "stream": {**old["stream"], "updates": old["stream"]["updates"] + [old["stream"]["updates"][-1]]}}
    babelfeed.build_train_iterator(cfg, world_size=1).set_state(dup)


def test_an_edited_epoch_the_run_never_reached_is_refused(root):
    """epoch: 1000000 in a state of epoch 1 was accepted, and without a ledger resuming counted epochs for hours
    (issue 23 item 4): the state's own step count and ledger say how far the run got."""
    it = babelfeed.build_train_iterator(config_for(root))
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    fresh = babelfeed.build_train_iterator(config_for(root))
    with pytest.raises(StateError, match="epoch 1000000 after 3 training steps"):
        fresh.set_state({**state, "epoch": 1000000})
    no_ledger = {k: v for k, v in state.items() if k != "ledger"}
    with pytest.raises(StateError, match="epoch 1000000 after 3 training steps"):
        fresh.set_state({**no_ledger, "epoch": 1000000}, mixture_change="keep_position")
    with pytest.raises(StateError, match="its ledger counts .* samples served before it"):
        fresh.set_state({**state, "epoch": 1000000, "total_steps": 2000000})
    # a bare position (an older loader's: no ledger, no step count) walked every epoch before it, for hours
    with pytest.raises(UsageError, match="lies 999,999 epochs after .* more than 10,000 are refused"):
        fresh.set_state({"epoch": 1000000, "consumed": 0, "fingerprint": state["fingerprint"]})
    fresh.set_state(state)  # the state as saved resumes
    assert np.array_equal(next(fresh)["id"], next(it)["id"])


def test_more_steps_than_the_run_can_have_served_are_refused(root):
    """Issue 39 item 6: total_steps 10**12 at epoch 1, global batch 5 was accepted, and the ledger reported that
    step. A step takes a global batch at least: at epoch 1 the steps are at most the batches consumed."""
    it = babelfeed.build_train_iterator(config_for(root))
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    assert state["epoch"] == 1 and state["total_steps"] == 5
    fresh = babelfeed.build_train_iterator(config_for(root))
    with pytest.raises(StateError, match=r"says 1,000,000,000,000 training steps by epoch 1, global batch 5, .* "
                                         r"can have served 5 at most"):
        fresh.set_state({**state, "total_steps": 10 ** 12})
    unsealed = {k: v for k, v in state.items() if k != "seal"}  # (an older babelfeed's: no seal)
    fresh.set_state({**unsealed, "total_steps": 4})  # fewer steps than batches (accumulation): possible
    fresh.set_state(state)
    assert np.array_equal(next(fresh)["id"], next(it)["id"])


def take(it, n: int) -> None:
    """``n`` batches from ``it``, across epochs (an epoch's end stops the iteration; the next call goes on)."""
    while n:
        n -= next(it, None) is not None


def test_an_older_state_far_past_the_data_resumes_at_once_and_says_its_ledger_starts_there(root):
    """Issue 39 item 3: a state without a ledger (an older babelfeed's) at epoch 3,000 or 1,000,000 made the first
    get_state() plan every earlier epoch, with nothing said, for hours. Up to 10,000 epochs the count is made at
    set_state (a progress bar), exact; beyond, the ledger counts from the state's epoch on, said once."""
    import time
    import warnings

    from babelfeed.errors import Notice
    from babelfeed.iterators.protocol import MAX_EPOCHS_AHEAD
    it = babelfeed.build_train_iterator(config_for(root))
    per_epoch = it.planner.num_batches(1)
    take(it, 2 * per_epoch + 3)
    state = json.loads(json.dumps(it.get_state()))
    assert state["epoch"] == 3
    older = {k: v for k, v in state.items() if k not in ("ledger", "seal")}  # (an older babelfeed's)
    fresh = babelfeed.build_train_iterator(config_for(root))
    fresh.set_state(older)  # counted from the plans of epochs 1 and 2: the same ledger
    assert fresh.get_state()["ledger"] == state["ledger"]
    far = MAX_EPOCHS_AHEAD + 10
    fresh = babelfeed.build_train_iterator(config_for(root))
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        fresh.set_state({**older, "epoch": far, "total_steps": far * per_epoch})
        got = fresh.get_state()
    assert time.perf_counter() - t0 < 30  # (it planned every epoch before: ~10 s for these at 1,000 a second)
    notes = [str(w.message) for w in said if issubclass(w.category, Notice)]
    assert len(notes) == 1 and f"the ledger counts from epoch {far:,} on" in notes[0], notes
    assert got["epoch"] == far and sum(got["ledger"]["samples"].values()) < per_epoch * 10_000
    # the states it writes say so ('ledger_from') and resume (they were refused as a ledger too small: review)
    assert got["ledger_from"] == far
    again = babelfeed.build_train_iterator(config_for(root))
    again.set_state(json.loads(json.dumps(got)))
    assert again.get_state()["ledger"] == got["ledger"]
    # the ledger report re-plans every epoch: refused past the limit rather than run for hours (review)
    from babelfeed.tools.ledger_report import translation_ledger
    with pytest.raises(UsageError, match=r"re-plans every epoch of the run, here 10,010, and more than 10,000"):
        translation_ledger(babelfeed.build_train_iterator(config_for(root)), got, progress=False)


@pytest.mark.parametrize("edit", [dict(epoch=2), dict(epoch=4), dict(epoch=2, total_steps=-1), dict(consumed=1),
                                  dict(total_steps=+1)])
def test_an_edited_position_is_refused_by_the_states_seal(root, edit):
    """Issue 39 item 9: an edited epoch (3 -> 2 or 4, with its step count) was accepted. A state carries a seal of
    its position; what is changed by hand no longer matches it. (A state without one, an older babelfeed's, is
    taken as before.)"""
    it = babelfeed.build_train_iterator(config_for(root))
    per_epoch = it.planner.num_batches(1)
    take(it, 2 * per_epoch + 3)
    state = json.loads(json.dumps(it.get_state()))
    assert state["epoch"] == 3 and "seal" in state
    changed = dict(state)
    for k, v in edit.items():
        changed[k] = v if k == "epoch" else state[k] + v
    if "total_steps" in edit and "epoch" in edit:  # with its step count: one epoch's fewer
        changed["total_steps"] = state["total_steps"] - per_epoch
    fresh = babelfeed.build_train_iterator(config_for(root))
    with pytest.raises(StateError, match=r"is not the one it was saved at \(its 'seal' differs\)"):
        fresh.set_state(changed)
    fresh.set_state({**state, **{k: np.int64(state[k]) for k in ("epoch", "consumed", "total_steps")}})  # a pytree's
    fresh.set_state(state)
    assert np.array_equal(next(fresh)["id"], next(it)["id"])


def test_a_run_whose_edit_shrank_its_epochs_resumes(root):
    """The steps bound read the epoch sizes of the current config: a run edited from big epochs to small ones
    (virtual_size 30,000 -> 60) was refused as 'edited or damaged (total_steps)' (found by a review)."""
    def run_to(it, epoch, consumed):
        while (s := it.get_state())["epoch"] < epoch or (s["epoch"] == epoch and s["consumed"] < consumed):
            next(it, None)
        return json.loads(json.dumps(s))

    big = babelfeed.build_train_iterator(config_for(root, mixing__virtual_size="30000"))
    saved = run_to(big, 2, 1)
    small = babelfeed.build_train_iterator(config_for(root, mixing__virtual_size="60"))
    small.set_state(saved, mixture_change="allow")
    later = run_to(small, 6, 1)
    fresh = babelfeed.build_train_iterator(config_for(root, mixing__virtual_size="60"))
    fresh.set_state(later)
    assert fresh.get_state()["total_steps"] == later["total_steps"]
