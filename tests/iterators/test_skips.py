"""it.skip after a loss spike: skipped rows leave their batches and nothing else moves; the skip is in the state's
history, so a run resumed later (fresh process, other world size) and a run rolled back and skipped both equal a
run that made the same skip and never stopped, leaf for leaf; the ledger counts what was served and what was
skipped; batch_for_step rebuilds any rank's batch of any step of a multi-segment run."""

import json
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest

import babelfeed
from babelfeed.errors import HistoryError, SkipError, UsageError
from synthetic import config_for, make_data_bin

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
DIRS = {"aaa-bbb": [600, 500], "aaa-ccc": [120, 80], "bbb-ccc": [200, 150]}
STREAM = {"mixing__sampler": "stream", "data__shards": "all", "batching__window": 150}
SEED = int(os.environ.get("BABELFEED_TEST_SEED", random.randrange(1 << 30)))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("skip")
    make_data_bin(r, directions=DIRS)
    return r


def cfg(root, **kw):
    return config_for(root, **{**STREAM, **kw})


def write_config(path, root, **kw) -> None:
    """A config file of :func:`cfg`'s config, for the command line."""
    path.write_text(f"import sys\nsys.path.insert(0, {HERE!r})\nfrom synthetic import config_for\n\n"
                    f"def get_config():\n    return config_for({str(root)!r}, **{ {**STREAM, **kw}!r})\n")


def leaves(batch, prefix=""):
    out = {}
    for k, v in batch.items():
        if isinstance(v, dict):
            out.update(leaves(v, prefix + k + "/"))
        else:
            out[prefix + k] = np.asarray(v)
    return out


def assert_same(a, b, what):
    la, lb = leaves(a), leaves(b)
    assert sorted(la) == sorted(lb), what
    for k in la:
        assert la[k].dtype == lb[k].dtype and la[k].shape == lb[k].shape and np.array_equal(la[k], lb[k]), \
            f"{what}: leaf {k} differs"


def served_ids(batch):
    return batch["id"][batch["weight"] > 0].tolist()


def run(its, steps, actions=None, record=None):
    """Serve ``steps`` steps on the ranks ``its`` (split="batches"); ``actions[step]`` runs on every rank before
    that step. Records every real global batch as ``record[(epoch, g)] = batch`` (not the epoch-padding ones)."""
    actions = actions or {}
    taken = 0
    while taken < steps:
        step = its[0].total_steps + 1
        for f in actions.get(step, ()):
            for it in its:
                f(it)
        epoch, base = its[0].epoch, its[0].consumed
        batches = [next(it, None) for it in its]
        if batches[0] is None:
            assert all(b is None for b in batches)
            continue
        n = its[0].epoch_batches(epoch)
        for r, b in enumerate(batches):
            if record is not None and base + r < n:
                record[(epoch, base + r)] = b
        taken += 1
    return record


@pytest.mark.parametrize("sampler", ["stream", "stratified"])
def test_a_skip_drops_rows_and_moves_nothing_else(root, sampler):
    ref = {}
    run([babelfeed.build_train_iterator(cfg(root, mixing__sampler=sampler))], 40, record=ref)
    it = babelfeed.build_train_iterator(cfg(root, mixing__sampler=sampler))
    got = {}
    run([it], 5, record=got)
    bad_ids = served_ids(ref[(1, 20)])[:3]
    it.skip(steps=range(8, 11), reason="spike at 9")
    it.skip(ids=bad_ids)
    it.skip(where={"corpus": "aaa-ccc", "shard": 1})
    run([it], 35, record=got)
    assert sorted(got) == sorted(ref)
    comps = {(c.key, c.shard): c for c in it.planner.sources.components}
    for key in sorted(ref):
        a, b = ref[key], got[key]
        if key[1] < 5:
            assert_same(a, b, f"batch {key} before the skips")
            continue
        desc = {d["id"]: d for d in it.describe_ids(a["id"][a["weight"] > 0])}
        gone = {i for i, d in desc.items() if i in bad_ids or (d["corpus"] == "aaa-ccc" and d["shard"] == 1)}
        if key[1] in (7, 8, 9):  # steps 8..10: the whole batch
            gone = set(desc)
        want = sorted(i for i in served_ids(a) if i not in gone)
        assert sorted(served_ids(b)) == want, key
        if not want:  # an empty batch: no sample named, nothing counted
            assert b["nsentences"] == 0 and b["ntokens"] == 0 and (b["id"] == -1).all() and len(b["id"]) == 1
        assert not set(b["id"].tolist()) & gone, f"a skipped sample's tokens are in batch {key}"
    assert comps  # (the components named above exist)


def test_skip_refuses_what_it_cannot_do(root):
    it = babelfeed.build_train_iterator(cfg(root))
    run([it], 6)
    with pytest.raises(SkipError, match="already taken.*roll back"):
        it.skip(steps=range(4, 9))
    with pytest.raises(SkipError, match="exactly one"):
        it.skip(steps=range(8, 9), ids=[1])
    with pytest.raises(SkipError, match="did you mean aaa-ccc"):
        it.skip(where={"corpus": "aaa-cc"})
    with pytest.raises(SkipError, match="no function"):
        it.skip(where=lambda d: True)
    with pytest.raises(SkipError, match="unknown terms"):
        it.skip(where={"language": "aaa"})
    with pytest.raises(SkipError, match="-1 marks"):
        it.skip(ids=[3, -1])
    with pytest.raises(SkipError, match="not an id of this data"):
        it.skip(ids=[10**9])
    with pytest.raises(SkipError, match="shard 7 is not a shard"):
        it.skip(where={"shard": 7})
    with pytest.raises(SkipError, match="from 0 or later"):
        it.skip(where={"corpus": "aaa-ccc", "rows": range(-5, 3)})
    n = max(len(c) for c in it.planner.sources.components if (c.key, c.shard) == ("aaa-ccc", 0))
    with pytest.raises(SkipError, match=f"hold at most {n:,} records"):
        it.skip(where={"corpus": "aaa-ccc", "shard": 0, "rows": range(n, n + 40)})
    with pytest.raises(SkipError, match="leaves no sample of the mixture"):
        it.skip(where={"corpus": ["aaa-bbb", "aaa-ccc", "bbb-ccc"]})
    with pytest.raises(SkipError, match="leaves no sample of the mixture"):
        it.skip(where={"rows": range(0, 10**9)})  # (ranges that cover every record, too)
    with pytest.raises(SkipError, match="not an id of this data"):
        it.skip(ids=np.array([2**63 + 1], np.uint64))
    with pytest.raises(SkipError, match="epochs ahead"):
        it.skip(steps=range(7, 10**12))
    assert not it.skips  # nothing recorded by a refused skip
    state = it.get_state()
    bad = dict(state, history=state["history"] + [{"event": "skip", "step": 6, "epoch": 1, "batch": 6,
                                                   "reason": "", "steps": [9, 8], "batches": []}])
    with pytest.raises(HistoryError, match="event 1 is"):
        babelfeed.build_train_iterator(cfg(root)).set_state(bad)
    late = dict(state, history=state["history"] + [{"event": "skip", "step": 6, "epoch": 1, "batch": 60,
                                                    "reason": "", "where": {"corpus": ["aaa-ccc"]}}])
    with pytest.raises(HistoryError, match="past the state's own position"):
        babelfeed.build_train_iterator(cfg(root)).set_state(late)
    early = dict(state, history=state["history"] + [{"event": "skip", "step": 6, "epoch": 1, "batch": 6,
                                                     "reason": "", "steps": [7, 9], "batches": [[1, 2, 4]]}])
    with pytest.raises(HistoryError, match="before its own position"):
        babelfeed.build_train_iterator(cfg(root)).set_state(early)
    later = {"event": "skip", "step": 5, "epoch": 1, "batch": 5, "reason": "", "where": {"corpus": ["aaa-ccc"]}}
    order = dict(state, history=state["history"] + [later, dict(later, step=3, batch=3)])
    with pytest.raises(HistoryError, match="skip events must come in training order"):
        babelfeed.build_train_iterator(cfg(root)).set_state(order)
    event = it.skip(where={"corpus": ["aaa-ccc"]})
    event["where"]["corpus"].append("aaa-bbb")  # (the caller's copy: the run's skip stays as made)
    assert it.get_state()["history"][-1]["where"] == {"corpus": ["aaa-ccc"]}


def test_skip_refuses_a_list_for_a_range_and_terms_no_shard_has_together(tmp_path):
    """skip(steps=[10, 11]) skipped step 10 alone (a list was read as the pair [lo, hi)); a where whose corpus has
    no such shard was accepted and skipped nothing. Both are refused, saying what to write."""
    make_data_bin(tmp_path / "bin", directions={"aaa-bbb": [60, 50], "aaa-ccc": [40]})
    it = babelfeed.build_train_iterator(cfg(tmp_path / "bin"))
    with pytest.raises(SkipError, match=re.escape("got [10, 11] (for 10 to 11, both included: range(10, 12); for "
                                                  "the pair [first, stop] that SpikeGuard logs")):
        it.skip(steps=[10, 11])
    with pytest.raises(SkipError, match=re.escape("where['rows'] takes a range")):
        it.skip(where={"corpus": "aaa-bbb", "rows": (0, 5)})
    with pytest.raises(SkipError, match=re.escape("no shard of this run matches every term (what the other terms "
                                                  "name has shard(s) [0]); it would skip nothing")):
        it.skip(where={"corpus": "aaa-ccc", "shard": 1})
    assert not it.skips
    it.skip(where={"corpus": "aaa-bbb", "shard": 1}, reason="the shard it has")
    assert len(it.skips.events) == 1


RESUME = r"""
import json, sys
import numpy as np
import babelfeed
sys.path.insert(0, sys.argv[1])
from synthetic import config_for
root, state_file, world, steps, out = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
cfg = config_for(root, mixing__sampler="stream", data__shards="all", batching__window=150)
state = json.load(open(state_file))
its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=world) for r in range(world)]
for it in its:
    it.set_state(state)
flat = {}
taken = 0
while taken < steps:
    epoch, base = its[0].epoch, its[0].consumed
    batches = [next(it, None) for it in its]
    if batches[0] is None:
        continue
    n = its[0].epoch_batches(epoch)
    for r, b in enumerate(batches):
        if base + r < n:
            def put(d, p):
                for k, v in d.items():
                    if isinstance(v, dict):
                        put(v, p + k + "/")
                    else:
                        flat[f"{epoch}:{base + r}:{p}{k}"] = np.asarray(v)
            put(b, "")
    taken += 1
np.savez(out, **flat)
print(json.dumps(its[0].ledger()))
"""


def test_skip_then_resume_later_in_a_fresh_process_on_three_ranks(root, tmp_path):
    rng = random.Random(SEED)
    probe = {}
    run([babelfeed.build_train_iterator(cfg(root))], 70, record=probe)
    t1 = rng.randrange(3, 10)
    cut = rng.randrange(t1 + 2, t1 + 12)  # (the skip, made after step t1, starts at cut - 1 > t1)
    steps = range(cut - 1, cut + 3)  # straddles the cut: part taken before it, part pending in the state
    later = [k for k in sorted(probe) if k[1] > cut + 4 and served_ids(probe[k])]
    ids = served_ids(probe[later[rng.randrange(len(later) // 2)]])[:4]
    actions = {t1 + 1: [lambda it: it.skip(steps=steps, reason="spike"), lambda it: it.skip(ids=ids),
                        lambda it: it.skip(where={"task": babelfeed.build_train_iterator(cfg(root)).planner.sources
                                                  .tasks[1:2], "rows": range(10, 40)})]}
    ref = {}
    it = babelfeed.build_train_iterator(cfg(root))
    run([it], cut, actions, ref)
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(it.get_state()))
    run([it], 60, record=ref)
    out = tmp_path / "resumed.npz"
    done = subprocess.run([sys.executable, "-c", RESUME, HERE, str(root), str(state_file), "3", "20", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = np.load(out)
    keys = sorted({tuple(int(x) for x in k.split(":")[:2]) for k in got.files})
    assert len(keys) >= 50, f"seed {SEED}"
    for key in keys:
        want = leaves(ref[key])
        have = {k.split(":", 2)[2]: got[k] for k in got.files if tuple(int(x) for x in k.split(":")[:2]) == key}
        assert sorted(want) == sorted(have), key
        for leaf in want:
            assert want[leaf].shape == have[leaf].shape and np.array_equal(want[leaf], have[leaf]), \
                f"seed {SEED}: batch {key} leaf {leaf}"
    assert any(not served_ids(ref[k]) for k in keys) or cut + 3 <= cut, "a skipped step lies after the cut"


@pytest.mark.parametrize("world", [1, 2])
def test_rollback_and_skip_equals_a_run_that_skipped_from_the_start(root, world):
    rng = random.Random(SEED + world)
    s = rng.randrange(15, 40)
    k = rng.randrange(3, 9)
    skip = range(s - 2, s + 1)
    ranks = lambda: [babelfeed.build_train_iterator(cfg(root), rank=r, world_size=world) for r in range(world)]
    # the diverged run: saves a state every step, spikes at s
    diverged, saved = ranks(), {}
    for step in range(1, s + 1):
        saved[step - 1] = diverged[0].get_state()
        run(diverged, 1)
    # roll back to s - k, skip, go on
    rolled = ranks()
    for it in rolled:
        it.set_state(json.loads(json.dumps(saved[s - k])))
        it.skip(steps=skip, reason=f"loss spike at step {s}")
    got = run(rolled, k + 20, record={})
    # a run that made the same skip at step s - k from the start
    ref = run(ranks(), s + 20, {s - k + 1: [lambda it: it.skip(steps=skip, reason=f"loss spike at step {s}")]}, {})
    assert set(got) <= set(ref) and len(got) >= world * (k + 19)
    for key in got:
        assert_same(ref[key], got[key], f"seed {SEED}: batch {key}")
    assert rolled[0].get_state()["history"][-1]["steps"] == [s - 2, s + 1]
    # the whole epoch: every skipped sample absent, every other one as often as without the skip
    plain, skipped = {}, {}
    run(ranks(), 130 // world + 1, record=plain)
    run(ranks(), 130 // world + 1, {s - k + 1: [lambda it: it.skip(steps=skip)]}, skipped)
    epoch1 = [key for key in plain if key[0] == 1]
    gone = [i for key in epoch1 if (s - 3) * world <= key[1] < s * world for i in served_ids(plain[key])]
    from collections import Counter

    before = Counter(i for key in epoch1 for i in served_ids(plain[key]))
    after = Counter(i for key in epoch1 for i in served_ids(skipped[key]))
    assert gone and before - Counter(gone) == after


def test_the_ledger_counts_served_and_skipped_rows(root):
    it = babelfeed.build_train_iterator(cfg(root))
    plain = run([babelfeed.build_train_iterator(cfg(root))], 90, record={})
    got = {}
    run([it], 4, record=got)
    it.skip(steps=range(10, 14))
    it.skip(where={"corpus": "bbb-ccc"})
    run([it], 86, record=got)
    keys = it.planner.keys
    direction_of = {}
    for b in got.values():
        for i, d in zip(b["id"].tolist(), b["direction"].tolist()):
            direction_of[i] = d
    ledger = it.ledger()
    served = np.bincount(np.concatenate([b["direction"][b["weight"] > 0] for b in got.values()]),
                         minlength=len(keys))
    assert [ledger[f"ledger/{k}/samples"] for k in keys] == served.tolist()
    lost = np.zeros(len(keys), np.int64)
    for key, b in plain.items():
        kept = set(served_ids(got[key]))
        for i, d in zip(b["id"][b["weight"] > 0].tolist(), b["direction"][b["weight"] > 0].tolist()):
            lost[d] += i not in kept
    assert [ledger[f"ledger/{k}/skipped"] for k in keys] == lost.tolist()
    assert ledger["ledger/skipped"] == lost.sum() > 0
    # the same counts from a state, in a new iterator (the epoch-start counts travel in the state)
    again = babelfeed.build_train_iterator(cfg(root))
    again.set_state(json.loads(json.dumps(it.get_state())))
    assert again.ledger() == ledger


def test_static_shapes_and_packed_rows_keep_their_shape(root):
    for kw in ({"batching__num_shapes": 3}, {"batching__pack": "64x64", "filter__max_source_positions": 64,
                                              "filter__max_target_positions": 64}):
        plain = run([babelfeed.build_train_iterator(cfg(root, **kw))], 30, record={})
        it = babelfeed.build_train_iterator(cfg(root, **kw))
        got = run([it], 2, record={})
        it.skip(steps=range(5, 7))
        it.skip(where={"corpus": "aaa-bbb", "rows": range(0, 300)})
        run([it], 28, record=got)
        gone = {d["id"] for b in plain.values() for d in it.describe_ids(b["id"][b["id"] >= 0])
                if d["corpus"] == "aaa-bbb" and d["row"] < 300}
        assert gone
        for key, b in got.items():
            a = plain[key]
            assert leaves(a)["net_input/src_tokens"].shape == leaves(b)["net_input/src_tokens"].shape, (kw, key)
            assert leaves(a)["target"].shape == leaves(b)["target"].shape, (kw, key)
            if key[1] >= 2:
                assert not set(b["id"].tolist()) & gone, (kw, key)
                if key[1] in (4, 5):
                    assert b["ntokens"] == 0 and (b["id"] == -1).all() and not b["weight"].any()
            else:
                assert_same(a, b, f"{kw} {key}")


def multi_segment_run(root, record, tmp_path, served=None):
    """1 rank with a weight change and a skip; resumed on 2 ranks with an edited mixture and a skip by id;
    resumed on 3 ranks with a skip of a corpus. Records every rank's batch per step; returns the final state."""
    seg = [cfg(root, data__directions="aaa-bbb,aaa-ccc"), cfg(root), cfg(root)]
    its = [babelfeed.build_train_iterator(seg[0])]
    tasks = its[0].planner.sources.tasks
    step = 0

    def go(its, n, actions=()):
        nonlocal step
        for i in range(n):
            for f in actions[i] if i < len(actions) else ():
                for it in its:
                    f(it)
            batches = [next(it, None) for it in its]
            if batches[0] is None:
                continue
            step += 1
            record[step] = (len(its), batches)
            if served is not None:  # a recount of what was served, named by the iterator that served it
                for b in batches:
                    for d in its[0].describe_ids(b["id"][b["weight"] > 0]):
                        served[(d["stream"], d["shard"])] = served.get((d["stream"], d["shard"]), 0) + 1

    go(its, 9, [[], [], [lambda it: it.set_weights({t: 1.0 + i for i, t in enumerate(tasks)})], [], [],
                [lambda it: it.skip(steps=range(8, 10), reason="spike")]])
    state = its[0].get_state()
    its = [babelfeed.build_train_iterator(seg[1], rank=r, world_size=2) for r in range(2)]
    for it in its:
        it.set_state(json.loads(json.dumps(state)), mixture_change="allow")
    ids = served_ids(record[3][1][0])[:3]
    go(its, 12, [[lambda it: it.skip(ids=ids)]])
    state = its[0].get_state()
    its = [babelfeed.build_train_iterator(seg[2], rank=r, world_size=3) for r in range(3)]
    for it in its:
        it.set_state(json.loads(json.dumps(state)))
    go(its, 10, [[], [lambda it: it.skip(where={"corpus": "aaa-ccc"}, reason="bad corpus")]])
    return its[0].get_state()


def test_batch_for_step_rebuilds_any_rank_of_any_step(root, tmp_path):
    record = {}
    state = multi_segment_run(root, record, tmp_path)
    events = [e["event"] for e in state["history"]]
    assert events.count("skip") == 3 and "edit" in events and "weights" in events
    probe = babelfeed.build_train_iterator(cfg(root))
    rng = random.Random(SEED)
    steps = sorted(record)
    for step in sorted(set(rng.sample(steps, 10)) | {8, 9, steps[-1]}):
        world, batches = record[step]
        for r in range(world):
            assert_same(batches[r], probe.batch_for_step(step, state, rank=r), f"seed {SEED}: step {step} rank {r}")
    with pytest.raises(UsageError, match="rank must be"):
        probe.batch_for_step(1, state, rank=1)
    # the command line, in a fresh process: the batch as an .npz, every leaf
    state_file = tmp_path / "final.json"
    state_file.write_text(json.dumps(state))
    cfg_file = tmp_path / "run.py"
    write_config(cfg_file, root)
    step = steps[-3]
    out = tmp_path / "batch.npz"
    done = subprocess.run([sys.executable, "-m", "babelfeed.cli", "replay", str(cfg_file), "--state", str(state_file),
                           "--step", str(step), "--rank", "2", "--out", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"step {step}" in done.stdout and "rank 2 of 3" in done.stdout
    got = np.load(out)
    want = leaves(record[step][1][2])
    assert sorted(got.files) == sorted(want)
    for k in want:
        assert np.array_equal(got[k], want[k]) and got[k].dtype == want[k].dtype, k


def test_the_ledger_report_recounts_every_corpus_and_shard(root, tmp_path):
    from babelfeed.tools.ledger_report import format_report, translation_ledger

    record, served = {}, {}
    state = multi_segment_run(root, record, tmp_path, served)
    report = translation_ledger(babelfeed.build_train_iterator(cfg(root)), state, progress=False)
    got = {(r["stream"], r["shard"]): r["samples"] for r in report["rows"] if r["samples"]}
    assert got == served
    it = babelfeed.build_train_iterator(cfg(root))
    it.set_state(state)
    ledger = it.ledger()
    for k in it.planner.keys:
        rows = [r for r in report["rows"] if r["stream"] == k]
        assert sum(r["samples"] for r in rows) == ledger[f"ledger/{k}/samples"], k
        assert sum(r["src_tokens"] for r in rows) == ledger[f"ledger/{k}/src_tokens"], k
        assert sum(r["skipped"] for r in rows) == ledger[f"ledger/{k}/skipped"], k
    assert report["totals"]["skipped"] == ledger["ledger/skipped"] == sum(e["samples"] for e in report["skips"]) > 0
    # the step skip dropped exactly its steps' rows (what trace names for them)
    steps = report["skips"][0]
    assert steps["what"] == "steps 8-9" and steps["reason"] == "spike"
    assert steps["samples"] == sum(len(it.trace(s, state)) for s in (8, 9))
    text = format_report(report, "final.json")
    assert f"1. after step 5 (epoch 1, global batch 5): steps 8-9: {steps['samples']} samples" in text
    assert "     why: spike\n" in text
    assert "3. after step" in text and "corpus aaa-ccc: " in text and "why: bad corpus" in text


def test_rows_split_replay_and_the_ledger_command(root, tmp_path, capsys):
    """split="rows" (every rank its rows of each global batch): skipped, resumed on 2 ranks, replayed per rank;
    then `babelfeed ledger` as JSON (the report), as a picture, and as a table."""
    from babelfeed.cli import main
    from babelfeed.tools.ledger_report import translation_ledger

    one = babelfeed.build_train_iterator(cfg(root, batching__num_shapes=3), split="rows")
    for _ in range(3):
        next(one)
    one.skip(steps=range(6, 8))
    one.skip(where={"corpus": "aaa-bbb", "rows": range(0, 200)})
    state = json.loads(json.dumps(one.get_state()))
    its = [babelfeed.build_train_iterator(cfg(root, batching__num_shapes=3), rank=r, world_size=2, split="rows")
           for r in range(2)]
    got = {}
    for it in its:
        it.set_state(state)
    for step in range(4, 16):
        got[step] = [next(it, None) or next(it) for it in its]
    final = its[0].get_state()
    probe = babelfeed.build_train_iterator(cfg(root, batching__num_shapes=3), split="rows")
    for step in (4, 6, 7, 9, 15):
        for r in range(2):
            assert_same(got[step][r], probe.batch_for_step(step, final, rank=r), f"step {step} rank {r}")
        if step in (6, 7):  # a skipped step: no rank holds a token
            assert got[step][0]["ntokens"] == got[step][1]["ntokens"] == 0
    cfg_file = tmp_path / "run.py"
    write_config(cfg_file, root, batching__num_shapes=3)
    state_file = tmp_path / "final.json"
    state_file.write_text(json.dumps(final))
    capsys.readouterr()
    assert main(["ledger", str(cfg_file), "--state", str(state_file), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    want = translation_ledger(babelfeed.build_train_iterator(cfg(root, batching__num_shapes=3)), final, progress=False)
    assert report == json.loads(json.dumps(want))
    assert [s["what"] for s in report["skips"]] == ["steps 6-7", "corpus aaa-bbb; rows 0-199"]
    pytest.importorskip("matplotlib")
    assert main(["ledger", str(cfg_file), "--state", str(state_file), "--plot", str(tmp_path / "pics")]) == 0
    out = capsys.readouterr().out
    assert "what run 'train' trained on, up to step 15" in out and "2. after step 3" in out
    assert os.path.getsize(tmp_path / "pics" / "ledger.png") > 10_000
    assert json.loads((tmp_path / "pics" / "ledger.json").read_text()) == report


def test_a_rollback_onto_another_world_size_skips_the_spiked_runs_steps(root):
    """The steps a spike names are the run's that spiked (2 ranks); the rollback runs on 3: skip(world_size=2)
    drops that run's global batches; without it the skip is refused (it used to take other batches silently)."""
    two = [babelfeed.build_train_iterator(cfg(root), rank=r, world_size=2) for r in range(2)]
    run(two, 10)
    saved = json.loads(json.dumps(two[0].get_state()))
    ref = run([babelfeed.build_train_iterator(cfg(root), rank=r, world_size=2) for r in range(2)], 40,
              {11: [lambda it: it.skip(steps=range(14, 17))]}, {})
    three = [babelfeed.build_train_iterator(cfg(root), rank=r, world_size=3) for r in range(3)]
    for it in three:
        it.set_state(saved)
    with pytest.raises(SkipError, match="world_size=2"):
        three[0].skip(steps=range(14, 17))
    for it in three:
        it.skip(steps=range(14, 17), world_size=2)
    got = run(three, 20, record={})
    assert len(got) >= 55
    for key in got:
        assert_same(ref[key], got[key], f"batch {key}")
    assert [k for k in got if not served_ids(got[k])] == [(1, g) for g in range(26, 32)]
    state = three[0].get_state()
    assert state["history"][-1]["world_size"] == 2
    assert any(s["what"] == "steps 14-16 (of a run on 2 ranks)" for s in
               __import__("babelfeed.tools.ledger_report", fromlist=["x"]).translation_ledger(
                   babelfeed.build_train_iterator(cfg(root)), state, progress=False)["skips"])


def test_the_state_records_the_split_and_replay_reads_it(root, tmp_path, capsys):
    """A split="rows" run's state says so: replay and trace take its split from the state (they used to assume
    "batches" and return a batch the rank never received); a flag that contradicts the state is refused; the
    ledger refuses a state of other data or settings."""
    from babelfeed.cli import main

    its = [babelfeed.build_train_iterator(cfg(root), rank=r, world_size=2, split="rows") for r in range(2)]
    plain = babelfeed.build_train_iterator(cfg(root), rank=1, world_size=2, split="rows")
    third = [b for _, b in zip(range(3), plain)][-1]  # (rank 1's rows of step 3: one of them is skipped)
    gone = int(third["id"][third["weight"] > 0][0])
    for it in its:
        it.skip(ids=[gone], reason="one row")
    got = [[next(it) for it in its] for _ in range(6)]
    state = its[0].get_state()
    assert [e["split"] for e in state["history"] if e["event"] == "ranks"] == ["rows"]
    # trace names the rank whose rows held each sample (it said None for every one: the global batch is ordered
    # before it is cut into the ranks' rows), and None for a skipped one
    from babelfeed.iterators.ledger import trace

    probe = babelfeed.build_train_iterator(cfg(root))
    for step in range(1, 7):
        served = {int(i): r for r, b in enumerate(got[step - 1])
                  for i, w in zip(b["id"].tolist(), b["weight"].tolist()) if w > 0}
        samples = trace(probe, step, state)
        assert len(samples) == len(served) + sum(s["skipped"] for s in samples) and len(set(served.values())) == 2
        assert {s["id"]: s["rank"] for s in samples if not s["skipped"]} == served
        assert [s["id"] for s in samples if s["skipped"]] == ([gone] if step == 3 else [])
        assert all(s["rank"] is None for s in samples if s["skipped"])
    cfg_file, state_file = tmp_path / "run.py", tmp_path / "rows.json"
    write_config(cfg_file, root)
    state_file.write_text(json.dumps(state))
    capsys.readouterr()
    assert main(["trace", str(cfg_file), "--state", str(state_file), "--step", "3"]) == 0
    table = capsys.readouterr().out.splitlines()
    head = table[1].split()
    assert head[:3] == ["rank", "batch", "id"] and head[-1] == "skipped", table[:2]
    shown = {int(ln.split()[2]): ln.split()[0] for ln in table[2:] if ln.split()[0] not in ("source:", "target:")}
    want = {s["id"]: "-" if s["rank"] is None else str(s["rank"]) for s in trace(probe, 3, state)}
    assert shown == want and want[gone] == "-"  # every sample's id and rank, the skipped one's none
    out = tmp_path / "b.npz"
    assert main(["replay", str(cfg_file), "--state", str(state_file), "--step", "5", "--rank", "1",
                 "--out", str(out)]) == 0
    said = capsys.readouterr()
    assert "rank 1 of 2 (split rows)" in said.out and "lies after" not in said.err
    assert main(["replay", str(cfg_file), "--state", str(state_file), "--step", "8",
                 "--out", str(tmp_path / "c.npz")]) == 0
    assert "warning: step 8 lies after the state's last step, 6:" in capsys.readouterr().err
    want = leaves(got[4][1])
    have = np.load(out)
    assert sorted(have.files) == sorted(want) and all(np.array_equal(have[k], want[k]) for k in want)
    assert main(["replay", str(cfg_file), "--state", str(state_file), "--step", "5", "--split", "batches",
                 "--out", str(out)]) == 2
    assert "the state records that step 5 was taken with split 'rows'" in capsys.readouterr().err
    assert main(["replay", str(cfg_file), "--state", str(state_file), "--step", "5", "--world-size", "3",
                 "--out", str(out)]) == 2
    assert "taken on 2 rank(s)" in capsys.readouterr().err
    batches = babelfeed.build_train_iterator(cfg(root), world_size=2)  # a "batches" run records its split too
    next(batches)
    state_file.write_text(json.dumps(batches.get_state()))
    assert main(["replay", str(cfg_file), "--state", str(state_file), "--step", "1", "--split", "rows",
                 "--out", str(out)]) == 2
    assert "taken with split 'batches'" in capsys.readouterr().err
    # a run without the stream sampler carries no config of its own: its ledger refuses other settings or data
    plain = babelfeed.build_train_iterator(cfg(root, mixing__sampler="stratified"))
    run([plain], 4)
    state_file.write_text(json.dumps(plain.get_state()))
    write_config(cfg_file, root, mixing__sampler="stratified")
    assert main(["ledger", str(cfg_file), "--state", str(state_file)]) == 0
    capsys.readouterr()
    assert main(["ledger", str(cfg_file), "--state", str(state_file), "--set", "seed=7"]) == 2
    assert "seed 1 -> 7" in capsys.readouterr().err
    # a stream-sampler run's state carries its config, which the commands follow: a config that differs is said
    stream = babelfeed.build_train_iterator(cfg(root))
    run([stream], 4)
    state_file.write_text(json.dumps(stream.get_state()))
    write_config(cfg_file, root)
    for command in (["ledger"], ["trace", "--step", "2"], ["replay", "--step", "2", "--out", str(out)]):
        assert main([command[0], str(cfg_file), "--state", str(state_file)] + command[1:]) == 0
        assert "note:" not in capsys.readouterr().err
        assert main([command[0], str(cfg_file), "--state", str(state_file), "--set", "seed=7"] + command[1:]) == 0
        err = capsys.readouterr().err
        assert f"babelfeed {command[0]} follows it; not used from this config: seed 7 (the run's: 1)" in err, err
