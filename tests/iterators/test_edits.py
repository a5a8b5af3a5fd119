"""Mixture edits on the paths users take: a run is cut at a random step, its config edited (temperature, corpora
added and removed, batching, LM datasets and weights) and resumed in a fresh process with
``mixture_change="allow"``, on 1, 2 and 3 ranks and another world size, through the bare iterator, ``BatchLoader``
with 0 and 2 workers and grain's ``EpochsDataset``:

* the first batch after the resume already follows the edited mixture (a removed stream never appears again, an
  added one does, from the next steps on);
* every adapter serves exactly the bare iterator's batches;
* the ledger grows by exactly the rows the ranks received, and a removed stream's counts stay;
* with the stream sampler, every stream's rows over the whole run are its own sequence, none lost or repeated;
* ``trace`` names the samples every rank received at every step, before and after the edit."""

import collections
import json
import re
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import babelfeed
import golden
from babelfeed.errors import ConfigTypeError, Notice, StateError, StateMismatch, UnknownConfigKey, UsageError, UsageTypeError
from babelfeed.plan.mixing import stream_rows
from babelfeed.plan.parts import decode
from synthetic import config_for, make_data_bin

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helpers are
BASE = {"batching__window": 150}
STREAM = {"mixing__sampler": "stream", "data__shards": "all"}
# (first config, edited config) as overrides of config_for
EDITS = {
    "temperature": ({}, {"mixing__temperature": 1.0}),
    "removed": ({}, {"data__directions": "aaa-bbb,aaa-ddd", "mixing__temperature": 2.0}),
    "added": ({"data__directions": "aaa-bbb,aaa-ccc"}, {"data__directions": "all"}),
    "batching": ({}, {"batching__max_tokens": 384, "mixing__temperature": 3.0}),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("edits")
    make_data_bin(r)
    golden.make_lm_data(r)
    return r


def cfg(root, sampler: str, over: dict):
    return config_for(root, **BASE, **(STREAM if sampler == "stream" else {}), **over)


def lockstep(its, steps: int) -> list:
    """Every rank's batches for ``steps`` steps (an epoch's end passed over)."""
    out = []
    while len(out) < steps:
        batches = [next(it, None) for it in its]
        if batches[0] is None:
            assert all(b is None for b in batches)
            continue
        out.append(batches)
    return out


CHILD = r"""
import json, sys, warnings
sys.path.insert(0, sys.argv[1])
warnings.simplefilter("ignore")
import numpy as np
import babelfeed
import golden
from test_edits import cfg, lockstep, lm_config, numpy

job = json.loads(sys.argv[3])
out = {}
if job["kind"] == "lm":
    config = lm_config(sys.argv[2], job["edited"])
    its = [babelfeed.build_iterator(config, rank=r, world_size=job["world"]) for r in range(job["world"])]
    for it in its:
        it.set_state(job["state"], mixture_change="allow")
    out["digests"] = [[golden.digest(b) for b in batches] for batches in lockstep(its, job["steps"])]
else:
    config = cfg(sys.argv[2], job["sampler"], job["edited"])
    its = [babelfeed.build_train_iterator(config, rank=r, world_size=job["world"]) for r in range(job["world"])]
    for it in its:
        it.set_state(job["state"], mixture_change="allow")
    out["report"] = its[0].last_edit.as_dict()
    batches = lockstep(its, job["steps"])
    out["ids"] = [[b["id"][b["weight"] > 0].tolist() for b in step] for step in batches]
    out["digests"] = [[golden.digest(b) for b in step] for step in batches]
    out["state"] = its[0].get_state()
    out["ledger"] = its[0].ledger()
    for adapter in job.get("adapters", []):
        got = []
        if adapter.startswith("loader"):
            from babelfeed.adapters.torch import BatchLoader

            workers = int(adapter[-1])
            loader = BatchLoader(config, rank=0, world_size=job["world"], num_workers=workers, tensors=False)
            loader.load_state_dict(job["state"], mixture_change="allow")
            while len(got) < job["steps"]:
                for b in loader:
                    got.append(golden.digest(numpy(b)))
                    if len(got) == job["steps"]:
                        break
        else:
            from babelfeed.adapters.grain import EpochsDataset

            it = iter(EpochsDataset(config, rank=0, world_size=job["world"], num_workers=0))
            it.set_state(job["state"], mixture_change="allow")
            got = [golden.digest(next(it)) for _ in range(job["steps"])]
        out[adapter] = got
print(json.dumps(out))
"""


def numpy(batch):
    """A batch through a DataLoader (its default conversion makes numpy leaves tensors) as the iterator made it."""
    if isinstance(batch, dict):
        return {k: numpy(v) for k, v in batch.items()}
    if hasattr(batch, "numpy"):
        a = batch.numpy()
        return a[()] if a.ndim == 0 else a
    return batch


def fresh(root, job: dict) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, HERE, str(root), json.dumps(job)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def lm_config(root, over: dict):
    c = babelfeed.load_config(os.path.join(os.path.dirname(HERE), "configs", "lm_packing.py"))
    c.data_path = over.get("data_path", f"0.4 {root}/lm/web 0.6 {root}/lm/books")
    c.seq_len, c.global_batch, c.num_samples = 24, 12, 12 * 40
    c.split, c.mode, c.cache_dir = "90,10,0", "pack", str(os.path.join(root, "cache"))
    return c


def streams_of(it, ids) -> list:
    return [d["stream"] for d in it.describe_ids(ids)]


def check_ledger(before: dict, after: dict, probe_new, rows: list, removed: list) -> None:
    """The ledger grows by the rows the ranks received (per stream); a removed stream's counts stay."""
    counts = collections.Counter(s for step in rows for ids in step for s in streams_of(probe_new, ids))
    for k in probe_new.planner.keys:
        assert after[f"ledger/{k}/samples"] - before.get(f"ledger/{k}/samples", 0) == counts[k], k
    for k in removed:
        assert after[f"ledger/{k}/samples"] == before[f"ledger/{k}/samples"], k


CASES = [  # (sampler, edit, world before, world after, steps before the cut, adapters)
    ("stratified", "removed", 2, 2, 5, ["loader0", "loader2", "grain0"]),
    ("stratified", "added", 1, 3, 9, []),
    ("stratified", "batching", 3, 1, 2, ["loader0"]),
    ("stream", "removed", 2, 3, 7, ["loader2"]),
    ("stream", "added", 3, 2, 4, ["grain0"]),
    ("stream", "temperature", 1, 1, 13, []),
]


@pytest.mark.parametrize("sampler, edit, world, after_world, cut, adapters", CASES)
def test_an_edit_resumed_in_a_fresh_process_follows_the_new_mixture_from_the_next_step(
        root, sampler, edit, world, after_world, cut, adapters):
    first, edited = EDITS[edit]
    its = [babelfeed.build_train_iterator(cfg(root, sampler, first), rank=r, world_size=world) for r in range(world)]
    head = lockstep(its, cut)
    state = json.loads(json.dumps(its[0].get_state()))
    before = its[0].ledger()
    steps = 24
    job = {"kind": "translation", "sampler": sampler, "edited": edited, "world": after_world, "state": state,
           "steps": steps, "adapters": adapters}
    got = fresh(root, job)
    probe = babelfeed.build_train_iterator(cfg(root, sampler, edited), world_size=after_world)
    probe.set_state(got["state"])  # (the run's numbering of ids, which an edit keeps)
    old_keys, new_keys = set(its[0].planner.keys), set(probe.planner.keys)
    removed, added = sorted(old_keys - new_keys), sorted(new_keys - old_keys)
    report = got["report"]
    assert report["step"] == cut + 1 and report["removed"] == removed and report["added"] == added
    # the first batch after the resume already follows the edited mixture
    first_streams = {s for ids in got["ids"][0] for s in streams_of(probe, ids)}
    assert not first_streams & set(removed)
    later = {s for step in got["ids"] for ids in step for s in streams_of(probe, ids)}
    assert set(added) <= later and not later & set(removed)
    # every adapter serves the bare iterator's batches (rank 0's)
    for adapter in adapters:
        assert got[adapter] == [step[0] for step in got["digests"]], adapter
    # the ledger: what the ranks received
    check_ledger(before, got["ledger"], probe, got["ids"], removed)
    # trace names every rank's samples at every step, before the edit and after it
    final = got["state"]
    record = [[sorted(b["id"][b["weight"] > 0].tolist()) for b in step] for step in head] + \
             [[sorted(ids) for ids in step] for step in got["ids"]]
    for s in range(1, len(record) + 1):
        rows = probe.trace(s, final)
        n = len(record[s - 1])
        assert [sorted(r["id"] for r in rows if r["rank"] == k and not r["skipped"]) for k in range(n)] == \
            record[s - 1], s
    if sampler == "stream":  # every stream's rows over the whole run: its own sequence, none lost or repeated
        rows = collections.defaultdict(list)
        old = babelfeed.build_train_iterator(cfg(root, sampler, first))
        for step in head:
            for b in step:
                for d in old.describe_ids(b["id"][b["weight"] > 0]):
                    rows[d["stream"]].append((d["shard"], d["row"]))
        for step in got["ids"]:
            for ids in step:
                for d in probe.describe_ids(ids):
                    rows[d["stream"]].append((d["shard"], d["row"]))
        ranks = [babelfeed.build_train_iterator(cfg(root, sampler, edited), rank=r, world_size=after_world)
                 for r in range(after_world)]
        for it in ranks:  # on to the epoch's end, where every stream's position is in the state
            it.set_state(final)
        while (batches := [next(it, None) for it in ranks])[0] is not None:
            for b in batches:
                for d in probe.describe_ids(b["id"][b["weight"] > 0]):
                    rows[d["stream"]].append((d["shard"], d["row"]))
        end = ranks[0].get_state()
        assert end["consumed"] == 0  # (the next epoch's start)
        planner = ranks[0].planner
        for d, key in enumerate(planner.keys):
            ahead = decode(end["served"][key]) if key in end.get("served", {}) else np.zeros(0, np.int64)
            positions = np.union1d(np.arange(end["stream"]["positions"][d]), ahead)
            assert len(rows[key]) == len(positions), key  # (none repeated: the counts equal)
            direction = planner.setup(end["epoch"]).directions[d]
            flat = stream_rows(planner.setup(end["epoch"]).draws, np.full(len(positions), d, np.int32), positions)
            comp, local = direction.locate(flat)
            shard = {int(c): int(planner.sources.components[int(c)].shard) for c in direction.component_ids}
            assert sorted(rows[key]) == sorted((shard[int(c)], int(r)) for c, r in zip(comp.tolist(),
                                                                                        local.tolist())), key


def test_an_lm_blend_edit_resumed_in_a_fresh_process_is_the_in_process_one(root):
    """An LM edit (weights, a dataset removed) resumed in a fresh process on another world size serves the batches
    the in-process edit serves, and the removed dataset's rows never come."""
    a = lm_config(root, {})
    its = [babelfeed.build_iterator(a, rank=r, world_size=2) for r in range(2)]
    lockstep(its, 5)
    state = json.loads(json.dumps(its[0].get_state()))
    edited = {"data_path": f"1.0 {root}/lm/books"}
    here = [babelfeed.build_iterator(lm_config(root, edited), rank=r, world_size=3) for r in range(3)]
    with pytest.warns(Notice, match="mixture edit: from step 6"):
        for it in here:
            it.set_state(state, mixture_change="allow")
    want = lockstep(here, 8)
    got = fresh(root, {"kind": "lm", "edited": edited, "world": 3, "state": state, "steps": 8})
    assert got["digests"] == [[golden.digest(b) for b in step] for step in want]
    names = here[0].dataset_names()
    assert all((b["dataset"] >= 0).all() and {names[i] for i in b["dataset"].tolist()} == {"books"}
               for step in want for b in step)


@settings(max_examples=12, deadline=None)
@given(sampler=st.sampled_from(["stratified", "stream"]), edit=st.sampled_from(sorted(EDITS)),
       world=st.integers(1, 3), after_world=st.integers(1, 3), cut=st.integers(0, 60), later=st.integers(1, 12),
       data=st.data())
def test_random_cuts_and_edits_resume_exactly_and_lose_nothing_of_the_ledger(
        root, sampler, edit, world, after_world, cut, later, data):
    """Cut at a random step (an epoch's first and last batch and its windows' ends among them), edited, then cut
    again after the edit and resumed: the batches are the uninterrupted edited run's, and the ledger grows by what
    the ranks received."""
    first, edited = EDITS[edit]
    its = [babelfeed.build_train_iterator(cfg(root, sampler, first), rank=r, world_size=world) for r in range(world)]
    n = len(its[0])
    cut = data.draw(st.sampled_from([cut, n - 1, n, n + 1, max(cut, 1)]))  # (an epoch's last steps)
    lockstep(its, cut)
    state = json.loads(json.dumps(its[0].get_state()))
    before = its[0].ledger()
    new = [babelfeed.build_train_iterator(cfg(root, sampler, edited), rank=r, world_size=after_world)
           for r in range(after_world)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        for it in new:
            it.set_state(state, mixture_change="allow")
    whole = lockstep(new, later + 8)
    ids = [[b["id"][b["weight"] > 0].tolist() for b in step] for step in whole]
    old_keys = set(its[0].planner.keys)
    removed = sorted(old_keys - set(new[0].planner.keys))
    check_ledger(before, new[0].ledger(), new[0], ids, removed)
    again = [babelfeed.build_train_iterator(cfg(root, sampler, edited), rank=r, world_size=after_world)
             for r in range(after_world)]
    mid = [babelfeed.build_train_iterator(cfg(root, sampler, edited), rank=r, world_size=after_world)
           for r in range(after_world)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        for it in mid:
            it.set_state(state, mixture_change="allow")
    lockstep(mid, later)
    saved = json.loads(json.dumps(mid[0].get_state()))
    for it in again:
        it.set_state(saved)  # a plain state of the edited run: no mixture_change needed
    rest = lockstep(again, 8)
    assert [[golden.digest(b) for b in step] for step in rest] == \
        [[golden.digest(b) for b in step] for step in whole[later:]]


def test_a_running_loader_with_workers_takes_an_edit_and_weights_at_the_next_batch(root):
    """BatchLoader (2 workers) and grain's EpochsDataset, edited and reweighted in the middle of a pass (the default
    sampler, where set_weights is an edit): from the next batch on they serve what the bare iterator serves after
    the same calls at the same step."""
    torch = pytest.importorskip("torch")
    from babelfeed.adapters.grain import EpochsDataset
    from babelfeed.adapters.torch import BatchLoader

    config = cfg(root, "stratified", {})
    bare = babelfeed.build_train_iterator(config)
    tasks = bare.planner.sources.tasks
    weights = {t: 1.0 + 3 * i for i, t in enumerate(tasks)}
    calls = {2: ("edit", {"mixing__temperature": 1.0}), 5: ("set_weights", weights)}

    def run(source, n: int, convert=lambda b: b) -> list:
        out = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Notice)
            for k, b in enumerate(source):
                out.append(golden.digest(convert(b)))
                if k in calls:
                    method, arg = calls[k]
                    getattr(holder, method)(**arg) if method == "edit" else getattr(holder, method)(arg)
                if len(out) == n:
                    break
        return out

    holder = bare
    want = run(bare, 12)
    holder = BatchLoader(config, num_workers=2, tensors=False, multiprocessing_context="forkserver")
    assert run(holder, 12, numpy) == want
    holder = iter(EpochsDataset(config, num_workers=0))
    assert run(holder, 12) == want
    state = holder.get_state()
    assert [e["event"] for e in state["history"] if e["event"] == "edit"] == ["edit", "edit"]
    del torch


def test_the_command_line_says_an_edit_writes_the_edited_state_and_the_ledger_shows_it(root, tmp_path, capsys):
    """babelfeed edit prints the edit (what changed, each stream's share before and after, the streams removed)
    and writes the edited run's state, which a run of the edited config resumes as it is; babelfeed ledger shows
    the edit on the run's timeline; an edit that changes nothing, or a key that is no config key, is refused."""
    from babelfeed.cli import main

    it = babelfeed.build_train_iterator(cfg(root, "stratified", {}))
    lockstep([it], 6)
    (tmp_path / "state.json").write_text(json.dumps(it.get_state()))
    base = ["nllb_like", f"--set=data.path={root}", "--set=batching.max_tokens=512",
            "--set=filter.max_source_positions=128", "--set=filter.max_target_positions=128",
            "--set=batching.window=150"]
    edit = base + ["--set=data.directions=aaa-bbb,aaa-ddd", "--set=mixing.temperature=2.0"]
    assert main(["edit", *edit, "--state", str(tmp_path / "state.json"), "--out", str(tmp_path / "edited.json")]) == 0
    out = capsys.readouterr().out
    assert "mixture edit: from step 7" in out and "mixing.temperature: 5.0 -> 2.0" in out
    assert "streams removed" in out and "aaa-ccc" in out and "share before  share after" in out
    edited = json.loads((tmp_path / "edited.json").read_text())
    again = babelfeed.build_train_iterator(cfg(root, "stratified", EDITS["removed"][1]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        again.set_state(state := json.loads((tmp_path / "state.json").read_text()), mixture_change="allow")
    plain = babelfeed.build_train_iterator(cfg(root, "stratified", EDITS["removed"][1]))
    plain.set_state(edited)  # the edited state: no mixture_change
    assert golden.digest(next(plain)) == golden.digest(next(again)) and state["total_steps"] == 6
    assert main(["ledger", *edit, "--state", str(tmp_path / "edited.json")]) == 0
    assert "mixture edits (1)" in capsys.readouterr().out
    assert main(["edit", *base, "--state", str(tmp_path / "state.json")]) == 2
    assert "nothing to edit" in capsys.readouterr().err
    with pytest.raises(UnknownConfigKey, match="not a key of the run's config"):
        it.edit(**{"mixing.temprature": 2.0})


def test_an_edit_of_a_mixing_schedule_on_another_world_size_resumes_exactly_and_traces(root):
    """A scheduled run (stream sampler, its weights changing at update 6 and 14) edited to another schedule and
    temperature, resumed on 3 ranks from 2: resumed again after the edit it serves the same batches, and trace
    names every step on both sides."""
    sched = {"mixing__schedule__boundaries": "6,14",
             "mixing__schedule__mode": "step",
             "mixing__schedule__weights": "aaa-bbb:1,aaa-ccc:0,aaa-ddd:1 | aaa-bbb:1,aaa-ccc:1,aaa-ddd:0 | "
                                          "aaa-bbb:0,aaa-ccc:1,aaa-ddd:1"}
    edited = {**sched, "mixing__schedule__weights": "aaa-bbb:1,aaa-ccc:1,aaa-ddd:1 | aaa-bbb:0,aaa-ccc:1,aaa-ddd:1 | "
                                                    "aaa-bbb:1,aaa-ccc:0,aaa-ddd:1", "mixing__temperature": 2.0}
    its = [babelfeed.build_train_iterator(cfg(root, "stream", sched), rank=r, world_size=2) for r in range(2)]
    head = lockstep(its, 5)
    state = json.loads(json.dumps(its[0].get_state()))
    new = [babelfeed.build_train_iterator(cfg(root, "stream", edited), rank=r, world_size=3) for r in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        for it in new:
            it.set_state(state, mixture_change="allow")
    after = lockstep(new, 11)
    final = json.loads(json.dumps(new[0].get_state()))
    again = [babelfeed.build_train_iterator(cfg(root, "stream", edited), rank=r, world_size=3) for r in range(3)]
    mid = [babelfeed.build_train_iterator(cfg(root, "stream", edited), rank=r, world_size=3) for r in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        for it in mid:
            it.set_state(state, mixture_change="allow")
    lockstep(mid, 6)
    for it in again:
        it.set_state(json.loads(json.dumps(mid[0].get_state())))
    assert [[golden.digest(b) for b in s] for s in lockstep(again, 5)] == \
        [[golden.digest(b) for b in s] for s in after[6:]]
    probe = babelfeed.build_train_iterator(cfg(root, "stream", edited), world_size=3)
    record = [[sorted(b["id"][b["weight"] > 0].tolist()) for b in s] for s in head + after]
    for s, want in enumerate(record, 1):
        rows = probe.trace(s, final)
        assert [sorted(r["id"] for r in rows if r["rank"] == k) for k in range(len(want))] == want, s


def test_ids_and_stream_numbers_keep_their_meaning_across_edits(root):
    """An edit that adds a stream in the middle of the config's order, then one that removes streams: an id
    traced before still names the same sample (a removed stream's too), batch["direction"] numbers the run's
    streams (it.stream_names) the same way throughout, and a fresh resume keeps the numbering."""
    it = babelfeed.build_train_iterator(cfg(root, "stratified", {"data__directions": "aaa-bbb,aaa-ddd"}))
    b = next(it)
    i = int(b["id"][b["weight"] > 0][0])
    before = it.describe_ids([i])[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        it.edit(**{"data.directions": "aaa-bbb,aaa-ccc,aaa-ddd"})
    assert it.describe_ids([i])[0] == before and it.stream_names == ["aaa-bbb", "aaa-ddd", "aaa-ccc"]
    for _ in range(3):
        b = next(it)
        real = b["weight"] > 0
        assert [it.stream_names[d] for d in b["direction"][real]] == \
            [d["stream"] for d in it.describe_ids(b["id"][real])]
    ccc = int(b["id"][real][[it.stream_names[d] == "aaa-ccc" for d in b["direction"][real]]][0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        it.edit(**{"data.directions": "aaa-ccc"})
    gone = it.describe_ids([i])[0]
    assert (gone["stream"], gone["shard"], gone["row"], gone["task"]) == (before["stream"], before["shard"],
                                                                        before["row"], None)
    assert it.describe_ids([ccc])[0]["stream"] == "aaa-ccc" and it.stream_names[2] == "aaa-ccc"
    state = json.loads(json.dumps(it.get_state()))
    fresh = babelfeed.build_train_iterator(cfg(root, "stratified", {"data__directions": "aaa-ccc"}))
    fresh.set_state(state)
    a, b = next(fresh), next(it)
    assert golden.digest(a) == golden.digest(b) and set(b["direction"].tolist()) == {2}
    with pytest.raises(StateError, match="'layout' lacks or miscounts"):
        fresh.set_state({**state, "layout": {**state["layout"], "streams": ["x"]}})


def test_a_loader_that_set_weights_on_the_default_sampler_resumes_with_them(root):
    """set_weights on the default sampler is an edit of the config's weights: a loader of the run's own config
    resumes its state with those weights (the batches of a run never stopped), and the policy picks them up."""
    pytest.importorskip("torch")
    from babelfeed.adapters.torch import BatchLoader
    from babelfeed.iterators.policy import ExponentiatedGradient

    config = cfg(root, "stratified", {})
    tasks = babelfeed.build_train_iterator(config).planner.sources.tasks
    weights = {t: 1.0 + i for i, t in enumerate(tasks)}
    loader, got = BatchLoader(config, tensors=False), []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        for k, b in enumerate(loader):
            got.append(golden.digest(numpy(b)))
            if k == 1:
                loader.set_weights(weights)
            if k == 3:
                state = loader.state_dict()
            if k == 6:
                break
    again = BatchLoader(cfg(root, "stratified", {}), tensors=False)
    again.load_state_dict(state)  # the run's own config: no mixture_change
    assert [golden.digest(numpy(b)) for _, b in zip(range(3), again)] == got[4:7]
    policy = ExponentiatedGradient.from_state(tasks, state)
    assert policy.weights == pytest.approx({t: w / sum(weights.values()) for t, w in weights.items()})


def test_an_lm_edit_that_removes_a_dataset_keeps_its_counts_and_traces_its_steps(root, capsys):
    """An LM run of two datasets edited to one: the ledger keeps the removed dataset's samples and tokens (the run's
    totals never go down), the state carries them, trace and batch_for_step answer the steps that drew from it, and
    babelfeed ledger lists it."""
    it = babelfeed.build_iterator(lm_config(root, {}))
    record = [next(it)["dataset"].tolist() for _ in range(5)]
    before = it.ledger()
    edited = {"data_path": f"1.0 {root}/lm/books"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        it.edit(**edited)
    after = it.ledger()
    assert {k: v for k, v in after.items() if k != "ledger/step"} == {k: v for k, v in before.items()
                                                                      if k != "ledger/step"}
    next(it)
    assert it.ledger()["ledger/tokens"] > before["ledger/tokens"]
    state = json.loads(json.dumps(it.get_state()))
    assert state["dormant"]["web"]["tokens"] == before["ledger/web/tokens"] > 0
    probe = babelfeed.build_iterator(lm_config(root, edited))
    names = ["web", "books"]
    for s in range(1, 6):
        assert [r["dataset"] for r in probe.trace(s, state)] == [names[d] for d in record[s - 1]], s
    assert probe.batch_for_step(2, state)["dataset"].tolist() == record[1]
    tmp = os.path.join(root, "lm_state.json")
    with open(tmp, "w") as f:
        json.dump(state, f)
    from babelfeed.cli import main

    cfg_file = os.path.join(root, "lm_edited.py")
    with open(cfg_file, "w") as f:
        f.write(f"import sys; sys.path.insert(0, {HERE!r}); sys.path.insert(0, {os.path.join(HERE, 'iterators')!r})\n"
                f"from test_edits import lm_config\ndef get_config():\n    return lm_config({str(root)!r}, "
                f"{edited!r})\n")
    assert main(["ledger", cfg_file, "--state", tmp, "--json"]) == 0
    rows = {r["dataset"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["web"]["tokens"] == before["ledger/web/tokens"] and rows["web"]["prefix"] == "(removed by an edit)"
    # read with the run's first config (which still names web): web once, and the totals are what was served
    from babelfeed.tools.ledger_report import lm_ledger

    report = lm_ledger(babelfeed.build_iterator(lm_config(root, {})), state)
    assert [r["dataset"] for r in report["rows"]].count("web") == 1
    assert report["totals"]["samples"] == state["consumed_samples"] == 6 * it.global_batch


def test_edits_a_run_cannot_take_are_refused_by_name_before_anything_is_built(root, monkeypatch):
    """Each refusal names the setting and what to do: a changed sampler (said before the edited iterator is
    built), a value of the wrong type, an edit that changes nothing, strict= of babelfeed 0.1, and an edit that
    changes static shapes says so in its report."""
    it = babelfeed.build_train_iterator(cfg(root, "stratified", {}))
    next(it)
    with pytest.raises(ConfigTypeError, match=r"mixing.temperature takes a float .*got 'hot'"):
        it.edit(mixing__temperature="hot")
    with monkeypatch.context() as m:
        m.setattr(it, "rebuild", lambda *a, **k: pytest.fail("the edited iterator was built"))
        with pytest.raises(StateMismatch, match=r"cannot change mixing.sampler \('auto' -> 'stream'\).*Keep mixing"):
            it.edit(mixing__sampler="stream")
    with pytest.raises(UsageError, match=r"nothing changed\): no edit to make"):
        it.edit(mixing__temperature=float(it.config_snapshot["mixing"]["temperature"]))
    with pytest.raises(UsageTypeError, match="strict= is gone.*mixture_change='keep_position'"):
        it.set_state(it.get_state(), strict=False)
    with pytest.raises(UsageTypeError, match="edit takes the edited config .*got int"):
        it.edit(42)
    with pytest.raises(UsageTypeError, match=r"got str \(a config's name or file: babelfeed.load_config\('nllb_like'\)"):
        it.edit("nllb_like")
    with warnings.catch_warnings():  # a section given as a dict edits its keys (it replaced the whole section)
        warnings.simplefilter("ignore", Notice)
        report = it.edit({"mixing": {"temperature": 1.5}})
        assert report.changes == {"mixing.temperature": [5.0, 1.5]}
        assert it.edit(mixing={"temperature": 2.5}).changes == {"mixing.temperature": [1.5, 2.5]}
    shaped = babelfeed.build_train_iterator(cfg(root, "stratified", {"batching__num_shapes": 4}))
    next(shaped)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", Notice)
        report = shaped.edit(mixing__temperature=1.0)
    assert report.shapes and "static shapes:" in report.table() and "compiles once" in report.table()
    assert [str(w.message) for w in caught if w.category is Notice] == [report.table()]


def test_loaders_go_on_into_later_epochs_after_an_edit_and_resume_an_edited_state_of_a_later_epoch(root):
    """BatchLoader and grain's EpochsDataset after an edit in epoch 1: the epoch ends, the state at the next epoch
    is taken and the next pass serves what the bare iterator serves; a state saved in epoch 2 resumes under an
    edited config (mixture_change="allow"). The loaders used to seek back to the start of epoch 1, before the
    edit, and failed in every epoch after it."""
    pytest.importorskip("torch")
    from babelfeed.adapters.grain import EpochsDataset
    from babelfeed.adapters.torch import BatchLoader

    config, edited = cfg(root, "stratified", {}), cfg(root, "stratified", {"mixing__temperature": 1.0})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        bare = babelfeed.build_train_iterator(config)
        n1 = bare.epoch_batches(1)
        want = [golden.digest(next(bare)) for _ in range(3)]
        bare.edit(mixing__temperature=1.0)
        want += [golden.digest(b) for b in bare]  # the rest of the (edited) epoch 1
        m = len(want)
        want += [golden.digest(next(bare)) for _ in range(4)]
        assert bare.position()[0] == 2 and m != n1

        loader = BatchLoader(config, tensors=False)
        got = []
        for k, b in enumerate(loader):
            got.append(golden.digest(numpy(b)))
            if k == 2:
                loader.edit(mixing__temperature=1.0)
        state = loader.state_dict()
        assert state["epoch"] == 2 and state["consumed"] == 0
        got += [golden.digest(numpy(b)) for _, b in zip(range(4), loader)]
        assert got == want
        again = BatchLoader(edited, tensors=False)
        again.load_state_dict(state)  # the edited run's state, in its next epoch, under the edited config
        assert [golden.digest(numpy(b)) for _, b in zip(range(4), again)] == want[m:]

        it = iter(EpochsDataset(config, num_workers=0))
        got = []
        for k in range(m + 4):
            got.append(golden.digest(next(it)))
            if k == 2:
                it.edit(mixing__temperature=1.0)
        assert got == want and it.get_state()["epoch"] == 2

        # a state of the unedited run saved in epoch 2, resumed under the edited config
        plain = babelfeed.build_train_iterator(config)
        lockstep([plain], n1 + 2)
        saved = plain.get_state()
        ref = babelfeed.build_train_iterator(edited)
        ref.set_state(saved, mixture_change="allow")
        want2 = [golden.digest(b[0]) for b in lockstep([ref], 3)]
        loader = BatchLoader(edited, tensors=False)
        loader.load_state_dict(saved, mixture_change="allow")
        assert [golden.digest(numpy(b)) for _, b in zip(range(3), loader)] == want2
        assert loader.state_dict()["epoch"] == 2
        it = iter(EpochsDataset(edited, num_workers=0))
        it.set_state(saved, mixture_change="allow")
        assert [golden.digest(next(it)) for _ in range(3)] == want2 and it.get_state()["epoch"] == 2


def test_set_weights_with_the_weights_in_force_is_no_edit_on_every_path(root):
    """A policy may hand set_weights the weights already in force (equal losses): on the default sampler that was
    an edit of nothing, refused as one, and a training loop crashed. It is no change: None, nothing recorded."""
    config = cfg(root, "stratified", {})
    it = babelfeed.build_train_iterator(config)
    weights = {t: 1.0 + i for i, t in enumerate(it.weight_names())}
    next(it)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        assert it.set_weights(weights) is not None
        edits = [e for e in it.get_state()["history"] if e["event"] == "edit"]
        next(it)
        assert it.set_weights({t: 3 * w for t, w in weights.items()}) is None  # the same weights, scaled
        assert it.set_weights(weights) is None
    assert [e for e in it.get_state()["history"] if e["event"] == "edit"] == edits
    pytest.importorskip("torch")
    from babelfeed.adapters.torch import BatchLoader

    loader = BatchLoader(config, tensors=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        for k, _ in enumerate(loader):
            loader.set_weights(weights)  # every step, the same weights
            if k == 4:
                break
    assert sum(e["event"] == "edit" for e in loader.state_dict()["history"]) == 1


@pytest.mark.parametrize("first, edited", [({}, {"mixing__sampler": "concat"}),
                                           ({"data__shards": "all"}, {"mixing__sampler": "stream"})])
def test_a_sampler_that_auto_resolves_otherwise_is_refused_on_every_edit_path(root, first, edited):
    """mixing.sampler="auto" (the default) resolves when a run is built: an edited config whose sampler resolves
    to another is refused in place and on resume (the resume path compared the edited
    config's sampler with itself and accepted it)."""
    run = babelfeed.build_train_iterator(cfg(root, "stratified", first))
    next(run)
    state = run.get_state()
    with pytest.raises(StateMismatch, match="cannot change mixing.sampler"):
        run.edit(**edited)
    with pytest.raises(StateMismatch, match="cannot change mixing.sampler"):
        babelfeed.build_train_iterator(cfg(root, "stratified", {**first, **edited})).set_state(
            state, mixture_change="allow")


def test_a_stream_removed_and_added_back_in_one_epoch_is_refused_on_the_epoch_samplers(root):
    """On the default sampler a stream's draw for an epoch is made when the epoch begins: added back in the epoch
    that removed it, rows of that draw were served again (89 of a direction's rows twice in 20 steps). The edit is
    refused, naming the stream and what works; in the next epoch it is taken."""
    config = cfg(root, "stratified", {})
    it = babelfeed.build_train_iterator(config)
    keys = list(it.stream_names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        for _ in range(3):
            next(it)
        it.edit(data__directions=",".join(keys[1:]))
        next(it)
        state = it.get_state()
        with pytest.raises(StateMismatch, match=f"stream {keys[0]} was removed by an edit earlier in epoch 1"):
            it.edit(data__directions="all")
        with pytest.raises(StateMismatch, match="add it back from epoch 2|Add it back from epoch 2"):
            babelfeed.build_train_iterator(config).set_state(state, mixture_change="allow")
        for _ in it:  # the rest of epoch 1
            pass
        report = it.edit(data__directions="all")
    assert report.added == [keys[0]] and it.position()[0] == 2


@pytest.mark.parametrize("damage", ["no part", "no layout", "no config", "no history", "no edit event"])
def test_an_edited_runs_state_missing_what_an_edit_wrote_is_refused_by_field(root, damage):
    """A state of an edited run whose part, layout or config was deleted, or whose edit event was taken out of its
    history, resumed silently into other batches (or renumbered samples); it is refused, naming the field."""
    config = cfg(root, "stratified", {})
    it = babelfeed.build_train_iterator(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        for _ in range(3):
            next(it)
        kept = ",".join(it.stream_names[1:])
        it.edit(mixing__temperature=1.0, data__directions=kept)
    next(it)
    state = json.loads(json.dumps(it.get_state()))
    assert {"part", "layout", "config", "dormant"} <= set(state)
    if damage == "no edit event":
        state["history"] = [e for e in state["history"] if e.get("event") != "edit"]
    else:
        del state[damage[3:]]
    edited = babelfeed.build_train_iterator(cfg(root, "stratified", {"mixing__temperature": 1.0,
                                                                      "data__directions": kept}))
    field = {"no history": "'part'", "no edit event": "'part'"}.get(damage, repr([damage[3:]]))
    with pytest.raises(StateError, match=re.escape(field)):
        edited.set_state(state)
