"""trace answers every step of a run from its latest state alone: across mixture edits (one landing exactly on a
window boundary, one on an epoch's end), weight changes before and after edits, world-size changes and epoch
boundaries, including steps before the last edit, and in a fresh process through the CLI."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import babelfeed
from helpers import as_v1, hist
from synthetic import config_for, make_data_bin
from babelfeed.errors import StateError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helpers are
DIRS = {"aaa-bbb": [600, 500], "aaa-ccc": [120, 80], "aaa-ddd": [12, 9], "bbb-ccc": [200, 150],
        "bbb-ddd": [90, 60]}
STREAM = {"mixing__sampler": "stream", "data__shards": "all", "batching__window": 150}
SEGMENTS = [dict(data__directions="aaa-bbb,aaa-ccc", mixing__temperature=5.0),
            dict(data__directions="aaa-bbb,aaa-ccc,bbb-ccc,bbb-ddd", mixing__temperature=2.0),
            dict(data__directions="aaa-bbb,bbb-ccc,bbb-ddd", mixing__temperature=2.0)]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("trace_history")
    make_data_bin(r, directions=DIRS)
    return r


def config(root, seg: int):
    return config_for(root, **STREAM, **SEGMENTS[seg])


def at_window_start(it) -> bool:
    where = it.planner.locate(it.epoch, it.consumed)
    return where is not None and where[1] == 0 and it.consumed > 0


def run_segment(its, rng, want: str, min_steps: int, record: dict, step: int, weights_at=(),
                weights_when: str | None = None) -> int:
    """Serve steps on every rank (recording each rank's ids per step) until the cut ``want`` is reached after at
    least ``min_steps``: "window" (the next step starts a planning window), "epoch" (an epoch just ended),
    "mid" (the next step is inside a window). Weights change before the steps ``weights_at`` of the segment, and
    once where ``weights_when`` first holds after 2 steps ("window": after a window's last batch; "epoch": after
    an epoch's last batch)."""
    taken = 0
    tasks = its[0].planner.sources.tasks
    ended = False

    def change():
        w = {t: float(rng.choice([0.2, 1.0, 3.0])) for t in tasks}
        for it in its:
            it.set_weights(w)

    while True:
        if taken in weights_at:
            change()
        if weights_when and taken >= 2 and ((weights_when == "window" and at_window_start(its[0]))
                                            or (weights_when == "epoch" and ended)):
            change()
            weights_when = None
        batches = [next(it, None) for it in its]
        ended = batches[0] is None
        if batches[0] is None:
            assert all(b is None for b in batches)
            if want == "epoch" and taken >= min_steps:
                return step
            continue
        step += 1
        taken += 1
        record[step] = [sorted(b["id"][b["weight"] > 0].tolist()) for b in batches]
        if taken < min_steps:
            continue
        if want == "window" and at_window_start(its[0]):
            return step
        if want == "mid" and not at_window_start(its[0]) and its[0].consumed > 0:
            return step


def traced(rows, world: int) -> list:
    return [sorted(r["id"] for r in rows if r["rank"] == k) for k in range(world)]


@pytest.mark.parametrize("cuts,seed,when", [(("window", "mid", "epoch"), 5, None),
                                            (("epoch", "window", "mid"), 6, "window"),
                                            (("mid", "epoch", "window"), 7, "epoch")])
def test_trace_answers_every_step_across_edits_weights_and_world_sizes(root, tmp_path, cuts, seed, when):
    """Three segments on 2, 3 and 1 ranks with two edits between them, then a resume on 2 ranks; each cut lands
    where the next step begins a window (the edit takes effect at once), at an epoch's end, or mid-window."""
    rng = np.random.default_rng(seed)
    record, step = {}, 0
    # 2 ranks, a weight change, then the first cut
    its = [babelfeed.build_train_iterator(config(root, 0), rank=r, world_size=2) for r in range(2)]
    step = run_segment(its, rng, cuts[0], 12, record, step, weights_at=(4,))
    s1 = json.loads(json.dumps(its[0].get_state()))
    # 3 ranks, two directions added and the temperature changed; weights changed
    its = [babelfeed.build_train_iterator(config(root, 1), rank=r, world_size=3) for r in range(3)]
    for it in its:
        it.set_state(s1, mixture_change="allow")
    step = run_segment(its, rng, cuts[1], 15, record, step, weights_at=(9,), weights_when=when)
    s2 = json.loads(json.dumps(its[0].get_state()))
    # 1 rank, a direction removed
    its = [babelfeed.build_train_iterator(config(root, 2), rank=0, world_size=1)]
    its[0].set_state(s2, mixture_change="allow")
    step = run_segment(its, rng, cuts[2], 10, record, step, weights_when=when)
    s3 = json.loads(json.dumps(its[0].get_state()))
    # 2 ranks, the same config: a world-size change only
    its = [babelfeed.build_train_iterator(config(root, 2), rank=r, world_size=2) for r in range(2)]
    for it in its:
        it.set_state(s3)
    step = run_segment(its, rng, "mid", 9, record, step)
    final = its[0].get_state()
    assert len(hist(final).edits) == 2 and len(record) == step

    probe = babelfeed.build_train_iterator(config(root, 2))  # any world size: trace picks each step's
    for s in range(1, step + 1):
        rows = probe.trace(s, final)
        world = len(record[s])
        assert traced(rows, world) == record[s], s
        assert all(r["step"] == s for r in rows)

    # in a fresh process, through the command, at random steps
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(final))
    cfg_file = tmp_path / "cfg.py"
    cfg_file.write_text(f"import sys\nsys.path.insert(0, {HERE!r})\nfrom test_trace_history import config\n"
                        f"def get_config():\n    return config({str(root)!r}, 2)\n")
    for s in sorted(rng.choice(np.arange(1, step + 1), 4, replace=False).tolist()):
        out = subprocess.run([sys.executable, "-m", "babelfeed.cli", "trace", str(cfg_file), "--state",
                              str(state_file), "--step", str(s), "--json"], capture_output=True, text=True,
                             timeout=180)
        assert out.returncode == 0, out.stderr
        assert traced(json.loads(out.stdout), len(record[s])) == record[s], s


def test_trace_answers_every_step_of_a_scheduled_run_on_three_world_sizes(root):
    """A step schedule (weights switch at an update count) on 2, then 3, then 1 rank: updates are counted per
    world size, and trace still names every step's samples."""
    sched = dict(data__directions="aaa-bbb,aaa-ccc", mixing__schedule__boundaries="6,15",
                 mixing__schedule__weights="aaa-bbb:1,aaa-ccc:1 | aaa-bbb:1,aaa-ccc:4 | aaa-bbb:4,aaa-ccc:1")
    cfg = config_for(root, data__shards="all", batching__window=150, **sched)
    rng = np.random.default_rng(3)
    record, step, state = {}, 0, None
    for world, cut in ((2, "mid"), (3, "window"), (1, "mid")):
        its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=world) for r in range(world)]
        if state is not None:
            for it in its:
                it.set_state(state)
        step = run_segment(its, rng, cut, 8, record, step)
        state = json.loads(json.dumps(its[0].get_state()))
    assert len(hist(state).updates) >= 2
    probe = babelfeed.build_train_iterator(cfg, world_size=2)
    for s in range(1, step + 1):
        assert traced(probe.trace(s, state), len(record[s])) == record[s], s


def test_a_state_of_an_older_babelfeed_traces_what_it_can_and_refuses_the_rest_by_name(root):
    """An edit as babelfeed 0.1 first recorded it (without the saved run's position and weights, and finishing the
    saved window before the edited config began): the state still resumes, and trace refuses the steps before the
    edit, saying why."""
    rng = np.random.default_rng(1)
    record, step = {}, 0
    its = [babelfeed.build_train_iterator(config(root, 0), rank=r, world_size=2) for r in range(2)]
    step = run_segment(its, rng, "mid", 6, record, step)
    s1 = json.loads(json.dumps(its[0].get_state()))
    its = [babelfeed.build_train_iterator(config(root, 1), rank=r, world_size=2) for r in range(2)]
    for it in its:
        it.set_state(s1, mixture_change="allow")
    edit_at = step
    step = run_segment(its, rng, "mid", 12, record, step)
    final = as_v1(json.loads(json.dumps(its[0].get_state())))
    for e in final["edits"]:  # (0.1's shape: saved_at_step, global_batch; no saved run)
        e["saved_at_step"], e["global_batch"] = e["step"], e.pop("batch")
        del e["saved"]
    probe = babelfeed.build_train_iterator(config(root, 1))
    probe.set_state(final)  # it resumes
    with pytest.raises(StateError, match=f"before mixture edit 1 of this run, which a babelfeed older"):
        probe.trace(edit_at, final)


def test_a_checkpoint_on_one_rank_and_weights_at_an_edited_epochs_start_keep_the_ranks_together(root):
    """After an edit's saved window is finished and the epoch ends, one rank saves (get_state plans its next
    epoch) and every rank then changes the weights: each rank serves what a fresh resume of the state saved
    after the change serves (get_state on rank 0 made it plan otherwise than the others; the change also
    dropped the edited epoch's start, so streams restarted from recomputed positions)."""
    rng = np.random.default_rng(2)
    record, step = {}, 0
    its = [babelfeed.build_train_iterator(config(root, 0), rank=r, world_size=2) for r in range(2)]
    step = run_segment(its, rng, "mid", 6, record, step)
    s1 = json.loads(json.dumps(its[0].get_state()))
    its = [babelfeed.build_train_iterator(config(root, 1), rank=r, world_size=3) for r in range(3)]
    for it in its:
        it.set_state(s1, mixture_change="allow")
    while [next(it, None) for it in its][0] is not None:  # the saved window, to the epoch's end
        pass
    its[0].get_state()
    for it in its:
        it.set_weights({t: w for t, w in zip(it.planner.sources.tasks, (3.0, 0.2, 1.0, 1.0))})
    after = json.loads(json.dumps(its[0].get_state()))
    for r, it in enumerate(its):
        fresh = babelfeed.build_train_iterator(config(root, 1), rank=r, world_size=3)
        fresh.set_state(after)
        for _ in range(6):
            assert np.array_equal(next(it)["id"], next(fresh)["id"]), r


def test_a_state_saved_before_the_first_step_on_a_new_world_size_restores(root):
    """Resumed on 3 ranks and saved at once, then on 4 and saved at once (a checkpoint right after a restart): the
    state restores, its steps naming the world size that will take the next step (it was refused: 'steps must
    list ... increasing steps')."""
    cfg = config(root, 0)
    it = babelfeed.build_train_iterator(cfg, world_size=2)
    for _ in range(5):
        next(it)
    state = it.get_state()
    for world in (3, 4, 1):
        it = babelfeed.build_train_iterator(cfg, world_size=world)
        it.set_state(json.loads(json.dumps(state)))
        state = it.get_state()
    assert hist(state).steps == [[0, 1, 0, 2], [5, 1, 10, 1]]
    fresh = babelfeed.build_train_iterator(cfg, world_size=3)
    fresh.set_state({**as_v1(state), "steps": [[0, 1, 0, 2], [5, 1, 10, 3], [5, 1, 10, 1]]})  # as version 1 wrote


def test_a_step_far_beyond_any_run_is_refused_not_planned_forever(root):
    """trace --step 10**20 planned about 1,300 epochs a second with no bound (issue 23 item 12): a step more
    than MAX_EPOCHS_AHEAD epochs ahead is refused at once, saying how far it lies; a step a few epochs on is
    answered."""
    from babelfeed.iterators.replay import MAX_EPOCHS_AHEAD
    from babelfeed.tools.cli import main

    it = babelfeed.build_train_iterator(config(root, 0))
    per = len(it)
    assert it.trace(3 * per + 1)  # three epochs on: planned and answered
    for step in (10 ** 20, per * (MAX_EPOCHS_AHEAD + 5)):
        with pytest.raises(StateError, match=r"epochs after step 1 .*refuses steps more than 10,000 epochs ahead"):
            it.trace(step)
    assert main(["trace", "nllb_like", f"--config.data.path={root}", "--step", str(10 ** 20)]) == 2
