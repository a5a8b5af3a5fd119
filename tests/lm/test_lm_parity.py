"""The LM path at parity with translation where it applies: a ledger that equals a recount of the rows served,
trace naming each step's samples (rank, dataset, epoch, records, documents) as the ranks received them, and
the command line: plan and trace on an LM config, inspect on a binarize --documents output."""

import json
import os

import numpy as np
import pytest

import babelfeed
import golden
from babelfeed.tools.cli import main
from babelfeed.errors import StateError, StateMismatch, UsageError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helpers are


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("lmparity")
    golden.make_lm_data(r)
    return r


def lm_config(root, mode="pack"):
    cfg = babelfeed.load_config("lm_packing")
    cfg.data_path = f"0.4 {root}/lm/web 0.6 {root}/lm/books"
    cfg.seq_len, cfg.global_batch, cfg.num_samples = 24, 12, 12 * 30
    cfg.split, cfg.mode, cfg.cache_dir = "90,10,0", mode, str(root / "cache")
    return cfg


@pytest.mark.parametrize("mode", ["pack", "concat", "sentences"])
def test_the_ledger_equals_a_recount_of_the_rows_served(root, mode):
    it = babelfeed.build_iterator(lm_config(root, mode))
    names = it.dataset_names()
    samples, tokens = np.zeros(len(names), np.int64), np.zeros(len(names), np.int64)
    rng = np.random.default_rng(3)
    stops = set(rng.choice(np.arange(1, len(it)), 4, replace=False).tolist()) | {len(it)}
    for k in range(1, len(it) + 1):
        b = next(it)
        d = np.asarray(b["dataset"], np.int64)
        samples += np.bincount(d, minlength=len(names))
        tokens += np.bincount(d, weights=(np.asarray(b["segment_ids"]) > 0).sum(axis=1), minlength=len(names)
                              ).astype(np.int64)
        if k in stops:  # the ledger at this position, also from a fresh iterator (counted from the plan)
            fresh = babelfeed.build_iterator(lm_config(root, mode))
            fresh.set_state(it.get_state())
            for ledger in (it.ledger(), fresh.ledger()):
                assert [ledger[f"ledger/{n}/samples"] for n in names] == samples.tolist(), (mode, k)
                assert [ledger[f"ledger/{n}/tokens"] for n in names] == tokens.tolist(), (mode, k)
                assert ledger["ledger/step"] == k and ledger["ledger/samples"] == k * it.global_batch
    passes = [it.ledger()[f"ledger/{n}/passes"] for n in names]
    assert all(p >= 0 for p in passes) and max(passes) >= 1  # the small datasets are read more than once


@pytest.mark.parametrize("world", [1, 3])
def test_trace_names_the_rows_each_rank_received(root, world):
    cfg = lm_config(root)
    its = [babelfeed.build_iterator(cfg, rank=r, world_size=world) for r in range(world)]
    probe = babelfeed.build_iterator(cfg, world_size=world)
    names = probe.dataset_names()
    for step in range(1, 9):
        batches = [next(it) for it in its]
        rows = probe.trace(step, its[0].get_state())
        assert len(rows) == cfg.global_batch and all(r["step"] == step for r in rows)
        for rank, b in enumerate(batches):
            mine = [r for r in rows if r["rank"] == rank]
            assert [names.index(r["dataset"]) for r in mine] == np.asarray(b["dataset"]).tolist()
            assert [r["tokens"] for r in mine] == (np.asarray(b["segment_ids"]) > 0).sum(axis=1).tolist()
            for r, tokens in zip(mine, np.asarray(b["tokens"])):  # the records hold the row's first tokens
                src = probe.sources[names.index(r["dataset"])]
                first = np.asarray(src.ds[r["records"][0]])
                assert r["records"] and r["documents"] and np.isin(tokens[:2], first).any()
    with pytest.raises(UsageError, match="past the run's end"):
        probe.trace(len(probe) + 1)


def test_the_command_plans_and_traces_an_lm_config_and_inspects_documents(root, tmp_path, capsys):
    cfg_file = tmp_path / "lm.py"
    cfg_file.write_text(f"import sys\nsys.path.insert(0, {HERE!r})\nfrom test_lm_parity import lm_config\n"
                        f"import pathlib\ndef get_config():\n    return lm_config(pathlib.Path({str(root)!r}))\n")
    assert main(["plan", str(cfg_file)]) == 0
    out = capsys.readouterr().out
    assert "LM run: 30 global batches of 12 samples" in out and "web" in out and "books" in out
    # each dataset's epochs of its tokens, and a warning past warn_upsample (issue 37's review: LM said nothing)
    it = babelfeed.build_iterator(lm_config(root))
    counts = np.bincount(it.dataset_index.astype(np.int64), minlength=len(it.sources))
    epochs = [c * it.seq_len / s.epoch_tokens() for c, s in zip(counts, it.sources)]
    assert all(f"{e:.2f}x" in out for e in epochs), out
    low = float(min(epochs)) / 2
    with open(cfg_file, "a") as f:
        f.write(f"\n_get = get_config\ndef get_config():\n    c = _get()\n    c.warn_upsample = {low!r}\n    return c\n")
    assert main(["plan", str(cfg_file)]) == 0
    out = capsys.readouterr().out
    assert f"warning: the run serves 2 of 2 datasets more than {low:g} times their tokens" in out, out
    assert main(["trace", str(cfg_file), "--step", "4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    it = babelfeed.build_iterator(lm_config(root))
    assert [r["sample"] for r in rows] == list(range(36, 48))
    assert [r["dataset"] for r in rows] == [it.dataset_names()[d] for d in it.dataset_index[36:48]]
    assert main(["trace", str(cfg_file), "--step", "4"]) == 0
    assert "documents" in capsys.readouterr().out
    # a binarize --documents output: its datasets, documents and tokens
    assert main(["inspect", str(root / "lm"), "--json"]) == 0
    stats = {r["dataset"]: r for r in json.loads(capsys.readouterr().out)}
    web = babelfeed.IndexedDataset(str(root / "lm" / "web"))
    assert stats["web"]["documents"] == len(web.doc_idx) - 1 and stats["web"]["tokens"] == web.num_tokens
    assert main(["inspect", str(root / "lm")]) == 0
    assert "documents" in capsys.readouterr().out


def test_the_loaders_report_an_lm_runs_ledger(root):
    """BatchLoader's ledger over an LM config, and the read-ahead adapters', are the iterator's at the batches the
    loop received (not the read-ahead): one ledger(prefix, at) for both kinds of run."""
    pytest.importorskip("torch")
    from babelfeed.adapters.torch import BatchLoader, TorchBatches

    cfg = lm_config(root)
    loader = BatchLoader(cfg)
    for _ in zip(range(5), loader):
        pass
    want = babelfeed.build_iterator(cfg).ledger(at=5)
    assert loader.ledger() == want and want["ledger/step"] == 5
    batches = TorchBatches(babelfeed.build_iterator(cfg), device="cpu", prefetch=3)
    for _ in range(5):
        next(batches)
    assert batches.ledger() == want  # (its thread has read ahead)
    batches.close()


def served_samples(batches, it) -> dict:
    """Per dataset name: the dataset's samples (its own sequence numbers) in the order the run served them."""
    out: dict = {}
    for g, b in batches:
        for d in it.describe_ids(np.arange(g * it.global_batch, (g + 1) * it.global_batch)):
            out.setdefault(d["dataset"], []).append((d["epoch"], d["index"]))
    return out


def own_sequence(it, name, n) -> list:
    """The first ``n`` samples of dataset ``name`` in its own order: (epoch, index within that epoch)."""
    src = it.sources[it.dataset_names().index(name)]
    epochs, samples = src.locate(np.arange(n))
    return list(zip(epochs.tolist(), samples.tolist()))


def test_lm_set_weights_resumes_exactly_and_each_dataset_keeps_its_own_sequence(root):
    from golden import digest

    cfg = lm_config(root)
    it = babelfeed.build_iterator(cfg)
    whole, served = [], []
    for k in range(len(it)):
        if k == 7:
            it.set_weights({"web": 0.05, "books": 1.0})
        if k == 19:
            it.set_weights({"web": 1.0, "books": 0.0})
        whole.append(digest(next(it)))
        served.append((k, None))
    state = it.get_state()
    events = [e for e in state["history"] if e["event"] == "blend"]
    assert [e["sample"] for e in events] == [0, 7 * 12, 19 * 12]
    plain = babelfeed.build_iterator(cfg)
    assert [digest(next(plain)) for _ in range(7)] == whole[:7]  # the same run up to the first change
    share = np.concatenate([np.asarray(b["dataset"]) for b in [plain.batch_at(k) for k in range(19, 30)]])
    seen = served_samples(served, it)
    for name, got in seen.items():  # no sample of a dataset repeated or skipped across the changes
        assert got == own_sequence(it, name, len(got)), name
    assert all(it.dataset_index[19 * 12:] == it.dataset_names().index("web")) and share.min() != share.max()
    for cut in sorted(np.random.default_rng(5).choice(np.arange(1, 30), 5, replace=False).tolist()) + [7, 19]:
        a = babelfeed.build_iterator(cfg)
        for k in range(cut):
            if k == 7:
                a.set_weights({"web": 0.05, "books": 1.0})
            if k == 19:
                a.set_weights({"web": 1.0, "books": 0.0})
            next(a)
        saved = json.loads(json.dumps(a.get_state()))
        b = babelfeed.build_iterator(cfg)
        b.set_state(saved)  # a fresh iterator: the changes before the cut come from the state's history
        rest = []
        for k in range(cut, 30):  # and the loop makes those after it, as the uninterrupted run did
            if k == 7:
                b.set_weights({"web": 0.05, "books": 1.0})
            if k == 19:
                b.set_weights({"web": 1.0, "books": 0.0})
            rest.append(digest(next(b)))
        assert next(b, None) is None
        assert rest == whole[cut:] and len(rest) == 30 - cut, cut
        steps = sorted({1, cut, 8, 20, 30} & set(range(1, 31)))
        probe = babelfeed.build_iterator(cfg)
        for s in steps:  # trace from the final state answers steps on both sides of every change
            want = it.describe_ids(np.arange((s - 1) * 12, s * 12))
            assert [r["records"] for r in probe.trace(s, state)] == [w["records"] for w in want], s
    it.ledger()  # (counted across the changes)
    led = it.ledger()
    counts = {n: len(v) for n, v in seen.items()}
    assert {n: led[f"ledger/{n}/samples"] for n in counts} == counts
    with pytest.raises(UsageError, match="for every dataset"):
        babelfeed.build_iterator(cfg).set_weights({"web": 1.0})
    with pytest.raises(UsageError, match="not all 0"):
        babelfeed.build_iterator(cfg).set_weights({"web": 0.0, "books": 0})


def test_an_lm_blend_edit_on_resume_loses_and_repeats_nothing(root, tmp_path):
    rng = np.random.default_rng(8)
    with babelfeed.IndexedDatasetBuilder(tmp_path / "news", np.int32, format="megatron") as b:
        for _ in range(30):
            for _ in range(2):
                b.add_item(rng.integers(10, 5000, int(rng.integers(5, 60))))
            b.end_document()
        b.finalize()
    first = lm_config(root)
    it = babelfeed.build_iterator(first)
    for _ in range(11):
        next(it)
    s1 = json.loads(json.dumps(it.get_state()))
    added = lm_config(root)
    added.data_path = f"0.2 {root}/lm/web 0.3 {root}/lm/books 0.5 {tmp_path}/news"
    with pytest.raises(babelfeed.StateMismatch, match="data_path weights"):
        babelfeed.build_iterator(added).set_state(s1)
    two = babelfeed.build_iterator(added)
    two.set_state(s1, mixture_change="allow")
    for _ in range(9):
        next(two)
    s2 = json.loads(json.dumps(two.get_state()))
    removed = lm_config(root)
    removed.data_path = f"0.5 {root}/lm/books 0.5 {tmp_path}/news"
    three = babelfeed.build_iterator(removed)
    three.set_state(s2, mixture_change="allow")
    rest = list(three)
    assert len(rest) == 30 - 20
    # per dataset, the samples of the three segments together are its own sequence: nothing lost or repeated
    seen: dict = {}
    for its, lo, hi in ((it, 0, 11), (two, 11, 20), (three, 20, 30)):
        for name, got in served_samples([(g, None) for g in range(lo, hi)], its).items():
            seen.setdefault(name, []).extend(got)
    for name, got in seen.items():
        owner = two if name in two.dataset_names() else it
        assert got == own_sequence(owner, name, len(got)), name
    assert set(seen) == {"web", "books", "news"} and len(seen["news"]) > 10
    led = three.ledger()  # web, removed by the last edit, still counts what it served
    assert led["ledger/samples"] == 30 * 12 and led["ledger/web/samples"] == len(seen["web"])
    assert led["ledger/books/samples"] == len(seen["books"]) and led["ledger/news/samples"] == len(seen["news"])
    final = three.get_state()
    events = [e for e in final["history"] if e["event"] == "blend"]
    assert [e["sample"] for e in events] == [0, 132, 240] and "changes" in events[-1]
    # trace from the last state: steps of the third segment by this config; a step of the first segment by the
    # config the state carries for it, naming web, which the current config no longer lists
    probe = babelfeed.build_iterator(removed)
    assert [r["records"] for r in probe.trace(25, final)] == [
        d["records"] for d in three.describe_ids(np.arange(24 * 12, 25 * 12))]
    early = probe.trace(3, final)
    assert [(r["dataset"], r["records"]) for r in early] == [
        (d["dataset"], d["records"]) for d in it.describe_ids(np.arange(24, 36))]
    assert "web" in {r["dataset"] for r in early}
    with_web = babelfeed.build_iterator(added)  # the config of the second segment traces every step
    assert [r["records"] for r in with_web.trace(3, final)] == [
        d["records"] for d in it.describe_ids(np.arange(24, 36))]
    other = lm_config(root)
    other.seq_len = 32
    with pytest.raises(StateMismatch, match="seq_len 24 -> 32"):
        babelfeed.build_iterator(other).set_state(s1, mixture_change="allow")


def test_lm_set_weights_through_the_read_ahead_applies_where_the_loop_stands(root):
    """The JAX and torch adapters read ahead in a thread: a change is made at the batch the loop has reached (the
    read-ahead is dropped and made again), as in-process."""
    from golden import digest
    from babelfeed.adapters.prefetch import Prefetcher

    cfg = lm_config(root)
    plain = babelfeed.build_iterator(cfg)
    ahead = Prefetcher(babelfeed.build_iterator(cfg), lambda b: b, depth=3)
    got, want = [], []
    for k in range(20):
        if k == 6:
            plain.set_weights({"web": 1.0, "books": 0.1})
            ahead.set_weights({"web": 1.0, "books": 0.1})
        want.append(digest(next(plain)))
        got.append(digest(next(ahead)))
    ahead.close()
    assert got == want and ahead.get_state()["history"] == plain.get_state()["history"]


def test_an_edited_lm_history_is_refused_and_weight_0_serves_nothing(root, tmp_path):
    """From the review: a first blend event not at sample 0 read uninitialised memory; edited offsets skipped
    samples or hung; events past the position or off a batch were accepted; weight 0 still served one sample a
    segment; a set_weights at an edited resume's sample dropped the edit's record; trace refused {"data": state}."""
    from babelfeed.errors import HistoryError

    cfg = lm_config(root)
    it = babelfeed.build_iterator(cfg)
    for _ in range(5):
        next(it)
    it.set_weights({"web": 0.0, "books": 1.0})
    served = [np.asarray(next(it)["dataset"]) for _ in range(10)]
    assert all((d == it.dataset_names().index("books")).all() for d in served)  # web at 0: none of it
    state = json.loads(json.dumps(it.get_state()))
    blends = [i for i, e in enumerate(state["history"]) if e["event"] == "blend"]

    def edited(i, **change):
        s = json.loads(json.dumps(state))
        s["history"][blends[i]].update(change)
        return s

    key = next(iter(state["history"][blends[1]]["offsets"]))
    for bad, match in ((edited(0, sample=8), "first blend event is at sample 0"),
                       (edited(1, sample=61), "at a global batch"),
                       (edited(1, sample=state["consumed_samples"] + 12), "no later than"),
                       (edited(1, offsets={**state["history"][blends[1]]["offsets"],
                                           key: state["history"][blends[1]]["offsets"][key] + 5}), "samples were taken"),
                       (edited(1, offsets={k: 10 ** 15 for k in state["history"][blends[1]]["offsets"]}),
                        "samples were taken")):
        with pytest.raises(HistoryError, match=match):
            babelfeed.build_iterator(cfg).set_state(bad)
    probe = babelfeed.build_iterator(cfg)
    assert probe.trace(3, {"data": state}) == probe.trace(3, state)
    # a set_weights at the sample an edited resume starts keeps the edit's record of what changed
    other = lm_config(root)
    other.data_path = f"0.1 {root}/lm/web 0.9 {root}/lm/books"
    two = babelfeed.build_iterator(other)
    two.set_state(state, mixture_change="allow")
    two.set_weights({"web": 1.0, "books": 1.0})
    last = [e for e in two.get_state()["history"] if e["event"] == "blend"][-1]
    assert "changes" in last and last["weights"] == {k: 1.0 for k in last["weights"]}


def test_the_policy_continues_from_an_lm_runs_last_blend(root):
    it = babelfeed.build_iterator(lm_config(root))
    next(it)
    it.set_weights({"web": 3.0, "books": 1.0})
    policy = babelfeed.iterators.policy.ExponentiatedGradient.from_state(it.dataset_names(), it.get_state(), floor=0.0)
    assert policy.weights == pytest.approx({"web": 0.75, "books": 0.25})
    with pytest.raises(StateError, match="the policy's tasks are"):
        babelfeed.iterators.policy.ExponentiatedGradient.from_state(["a", "b"], it.get_state())
