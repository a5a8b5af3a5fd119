"""Tasks (corpora grouped under a name, sharing files), the stream sampler and mixing schedules in the planner."""

import json
import os

import numpy as np
import pytest

import babelfeed
from babelfeed.config import task
from synthetic import config_for, make_data_bin
from helpers import digest
from babelfeed.errors import BabelfeedError, ConfigError, StateError

MONO = 150  # sentences of the monolingual corpus "ccc"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    truth = make_data_bin(root)
    rng = np.random.default_rng(5)
    with babelfeed.IndexedDatasetBuilder(os.path.join(root, "shard000", "train.ccc"), np.uint16, format="fairseq") as b:
        for r in range(MONO):
            toks = np.concatenate([[100 + r % 50], rng.integers(4, 300, int(rng.integers(3, 30))), [2]])
            truth[("train", "ccc", "ccc", 0, r)] = toks
            b.add_item(toks)
        b.finalize()
    return root, truth


def task_config(root, tasks, **overrides):
    cfg = config_for(root, data__shards="all", **overrides)
    with cfg.unlocked():
        for name, t in tasks.items():
            cfg.tasks[name] = t
    return cfg


TWO = {"mt": task("aaa-bbb,aaa-ccc", weight=3.0), "dae": task("ccc", weight=1.0, kind="denoise",
                                                                   transforms="token_drop:rate=0.3")}


def task_of_rows(it, batch):
    streams = it.planner.sources.streams
    return [streams[int(d)].task for d, w in zip(batch["direction"], batch["weight"]) if w > 0]


# ------------------------------------------------------------------------------------------- tasks
def test_two_tasks_share_one_corpus_without_copies(data):
    root, truth = data
    tasks = {"dae_drop": task("ccc", weight=1.0, kind="denoise", transforms="token_drop:rate=0.5"),
             "dae_mask": task("ccc", weight=1.0, kind="denoise", transforms="span_mask:ratio=0.5,mask_id=w0",
                              source_prefix="__bt__ __{lang}__"),
             "mt": task("aaa-bbb", weight=1.0)}
    it = babelfeed.build_train_iterator(task_config(root, tasks, mixing__sampler="concat"))
    sources = it.planner.sources
    assert sources.keys == ["dae_drop/ccc", "dae_mask/ccc", "mt/aaa-bbb"]
    assert sources.tasks == ["dae_drop", "dae_mask", "mt"]
    by_stream = {c.key: c for c in sources.components}
    assert by_stream["dae_drop/ccc"].src is by_stream["dae_mask/ccc"].src  # one open file, two tasks
    d = sources.dictionary
    seen = {"dae_drop": 0, "dae_mask": 0}
    for batch in it:
        src = batch["net_input"]["src_tokens"]
        for i, (di, gid) in enumerate(zip(batch["direction"], batch["id"])):
            name = sources.keys[int(di)]
            if not name.endswith("/ccc"):
                continue
            comp_idx = int(np.searchsorted(it.collater.id_base, gid, side="right") - 1)
            row = int(gid - it.collater.id_base[comp_idx])
            clean = truth[("train", "ccc", "ccc", 0, row)].tolist()
            got = src[i][src[i] != d.pad()].tolist()
            tgt = batch["target"][i][batch["target"][i] != d.pad()].tolist()
            assert tgt == [d.lang_token_index("ccc")] + clean  # the target stays clean (duplicate-mono)
            task_name = name.split("/")[0]
            if task_name == "dae_mask":
                assert got[:2] == [d.index("__bt__"), d.lang_token_index("ccc")]
            else:
                assert got[0] == d.lang_token_index("ccc")
            seen[task_name] += got[-len(clean):] != clean
    assert seen["dae_drop"] > MONO // 2 and seen["dae_mask"] > MONO // 2  # both tasks, each its own noise


def test_task_settings_are_checked(data):
    root, _ = data
    cases = [({"x": task("aaa-bbb", kind="denoise", transforms="token_drop:rate=0.1")}, "monolingual"),
             ({"x": task("ccc", kind="denoise")}, "no transforms"),
             ({"x": task("zzz-yyy")}, "no train data"),
             ({"a/b": task("ccc")}, "must be a word: not empty, no spaces, no '/'"),
             ({"a b": task("ccc")}, "must be a word"),
             ({"x": task("ccc", transforms="scramble:x=1")}, "unknown transform")]
    for tasks, match in cases:
        with pytest.raises(BabelfeedError, match=match):
            babelfeed.build_train_iterator(task_config(root, tasks))
    with pytest.raises(ConfigError, match=r"task\('ccc'\).kind must be one of 'translation', 'denoise'"):
        task("ccc", kind="dance")  # (refused where it is written, by the key table's rule for tasks)
    with pytest.raises(ConfigError, match="per task"):
        babelfeed.build_train_iterator(task_config(root, TWO, data__noise="token_drop:rate=0.1"))
    with pytest.raises(ConfigError, match="must stay 'temperature'"):
        babelfeed.build_train_iterator(task_config(root, TWO, mixing__method="uniform"))


def test_task_weights_set_the_mix_and_temperature_splits_a_task(data):
    root, _ = data
    it = babelfeed.build_train_iterator(task_config(root, TWO, mixing__temperature=1.0, mixing__virtual_size="40000"))
    setup = it.planner.setup(1)
    p = dict(zip(it.planner.sources.keys, setup.probs))
    assert p["mt/aaa-bbb"] + p["mt/aaa-ccc"] == pytest.approx(0.75)
    assert p["mt/aaa-bbb"] / p["mt/aaa-ccc"] == pytest.approx(1100 / 200)  # T = 1 within the task
    assert p["dae/ccc"] == pytest.approx(0.25)
    assert it.planner.sources.tasks == ["dae", "mt"]  # ConfigDict keeps task names sorted


# ------------------------------------------------------------------------------------------- stream sampler
def test_each_stream_cycles_its_own_data(data):
    root, _ = data
    cfg = task_config(root, TWO, mixing__sampler="stream", mixing__virtual_size="1000", batching__window=300)
    it = babelfeed.build_train_iterator(cfg)
    rows = {}
    for _ in range(4):
        for batch in it:
            for d, gid, w in zip(batch["direction"], batch["id"], batch["weight"]):
                rows.setdefault(int(d), []).append(int(gid))
    for d, stream in enumerate(it.planner.setup(it.epoch).directions):
        planned = int(it.planner.epoch_start(5)[0][d])
        got = sorted(rows[d])
        assert len(got) == planned  # nothing filtered here: every planned sample was served
        n = stream.size
        base = it.collater.id_base[stream.component_ids[0]]
        counts = np.bincount(np.asarray(got) - base, minlength=n)
        assert len(counts) == n
        full, rest = divmod(planned, n)
        assert counts.max() - counts.min() <= 1 and (counts >= full).all()  # whole passes, then part of one
    stats = it.task_stats()
    assert stats["dae"]["samples"] == int(it.planner.epoch_start(5)[0][it.planner.keys.index("dae/ccc")])
    assert stats["dae"]["epochs"] == pytest.approx(stats["dae"]["samples"] / MONO)
    assert stats["dae"]["epochs"] > 1 and stats["mt"]["epochs"] > 1  # each task past its own first pass
    assert stats["mt"]["served"] + stats["dae"]["served"] == 4000


def run_steps(cfg, steps, world_size=1, split="batches"):
    its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=world_size, split=split) for r in range(world_size)]
    out = []
    while len(out) < steps:
        got, ended = [], 0
        for i in its:
            try:
                got.append(next(i))
            except StopIteration:
                ended += 1
        assert ended in (0, len(its))  # every rank ends an epoch at the same step
        out.extend(got)
    return its, out[:steps]


SCHED = dict(mixing__schedule__boundaries="20", mixing__schedule__weights="mt:1,dae:0 | mt:0,dae:1",
             mixing__virtual_size="3000", batching__window=400)


def test_step_schedule_switches_at_the_boundary_update(data):
    root, _ = data
    cfg = task_config(root, TWO, batching__accumulation=2, **SCHED)
    its, batches = run_steps(cfg, 120, world_size=2)
    assert its[0].planner.opts.sampler == "stream" and its[0].planner.opts.batches_per_update == 4
    tasks = [set(task_of_rows(its[0], b)) for b in batches if b["nsentences"]]
    first_dae = next(i for i, t in enumerate(tasks) if "dae" in t)
    assert all(t == {"mt"} for t in tasks[:first_dae])
    assert all(t == {"dae"} for t in tasks[first_dae + 1:])
    assert abs(first_dae - 20 * 4) <= 4  # update 20 = global batch 80; the window was cut there


def test_a_boundary_is_the_same_point_for_any_batch_split(data):
    root, _ = data
    _, full = run_steps(task_config(root, TWO, batching__accumulation=4, **SCHED), 150)
    for world, acc, split in ((2, 2, "batches"), (4, 1, "batches"), (1, 4, "rows")):
        cfg = task_config(root, TWO, batching__accumulation=acc, **SCHED)
        _, got = run_steps(cfg, 150, world_size=world, split=split)
        got = [b for b in got if b["nsentences"]]  # an epoch's last step may be padded with masked batches
        ref = [b for b in full if b["nsentences"]]
        n = min(len(got), len(ref)) - 4
        got, ref = got[:n], ref[:n]
        assert n > 120
        if split == "batches":
            assert [digest(b) for b in got] == [digest(b) for b in ref], (world, acc)
        else:
            assert [sorted(b["id"].tolist()) for b in got] == [sorted(r["id"].tolist()) for r in ref], (world, acc)


def test_linear_schedule_moves_the_mix_window_by_window(data):
    root, _ = data
    cfg = task_config(root, TWO, mixing__schedule__boundaries="60",
                      mixing__schedule__weights="mt:1,dae:0 | mt:0,dae:1", mixing__schedule__mode="linear",
                      mixing__virtual_size="4000", batching__window=200)
    it = babelfeed.build_train_iterator(cfg)
    planner, share = it.planner, []
    for w in range(12):
        mark = planner.stream_mark(1, w)
        probs = planner.probabilities(planner.setup(1).directions, mark.update)
        share.append(probs[0])
        assert probs[0] == pytest.approx(min(mark.update / 60, 1.0))
    assert share[0] == 0 and all(b >= a for a, b in zip(share, share[1:])) and share[-1] == 1


@pytest.mark.parametrize("cut", [3, 37, 81, 140])
def test_resume_lands_on_the_same_weights_and_batches(data, cut):
    root, _ = data
    cfg = task_config(root, TWO, **SCHED)
    _, ref = run_steps(cfg, 200)
    a = babelfeed.build_train_iterator(cfg)
    _, head = run_steps(cfg, cut)
    for _ in range(cut):
        try:
            next(a)
        except StopIteration:
            next(a)
    state = json.loads(json.dumps(a.get_state()))
    assert "stream" in state
    b = babelfeed.build_train_iterator(cfg)
    b.set_state(state)
    assert b.update() == pytest.approx(a.update())
    tail = []
    while len(tail) < 200 - cut:
        try:
            tail.append(next(b))
        except StopIteration:
            pass
    assert [digest(x) for x in head + tail] == [digest(x) for x in ref]
    # without the stream positions (an edited or older state) a state is refused; mixture_change='keep_position'
    # re-plans the earlier epochs to find them
    del state["stream"]
    c = babelfeed.build_train_iterator(cfg)
    with pytest.raises(StateError, match="lacks 'stream'"):
        c.set_state(state)
    c.set_state(state, mixture_change="keep_position")
    assert digest(next(c)) == digest(tail[0])


def test_schedule_settings_are_checked(data):
    root, _ = data
    with pytest.raises(ConfigError, match="every task"):
        babelfeed.build_train_iterator(task_config(root, TWO, mixing__schedule__boundaries="5",
                                                mixing__schedule__weights="mt:1 | mt:1,dae:1"))
    with pytest.raises(ConfigError, match="weights is empty"):
        babelfeed.build_train_iterator(task_config(root, TWO, mixing__schedule__boundaries="5"))
    with pytest.raises(ConfigError, match="needs 2 weight lists|needs mixing.sampler"):
        babelfeed.build_train_iterator(task_config(root, TWO, mixing__sampler="stratified", **SCHED))
    with pytest.raises(ConfigError, match="data.shards='all'"):
        babelfeed.build_train_iterator(config_for(root, mixing__sampler="stream"))
    with pytest.raises(ConfigError, match="accumulation"):
        babelfeed.build_train_iterator(task_config(root, TWO, batching__accumulation=0))
    # without a tasks section, every direction is a task and the schedule names directions
    cfg = config_for(root, data__shards="all", mixing__schedule__boundaries="10",
                     mixing__schedule__weights="aaa-bbb:1,aaa-ccc:1,aaa-ddd:0 | aaa-bbb:0,aaa-ccc:1,aaa-ddd:1")
    it = babelfeed.build_train_iterator(cfg)
    assert it.planner.sources.tasks == ["aaa-bbb", "aaa-ccc", "aaa-ddd"] and it.planner.opts.sampler == "stream"


def test_preview_uses_a_tasks_own_corpus_prefix_and_transforms(data):
    from babelfeed.tools.preview import preview

    root, _ = data
    tasks = {**TWO, "bt": task("aaa-bbb", weight=1.0, source_prefix="__bt__ __{src}__",
                               transforms="token_drop:rate=0.5")}
    cfg = task_config(root, tasks)
    out = preview(cfg, "dae", "", n=3)
    assert out.startswith("ccc (source)") and "token_drop {'rate': 0.3}" in out
    out = preview(cfg, "bt/aaa-bbb", "", n=2)
    assert "__bt__" in out and "token_drop {'rate': 0.5}" in out
    with pytest.raises(ConfigError, match="no task 'zz'"):
        preview(cfg, "zz", "token_drop:rate=0.1")
