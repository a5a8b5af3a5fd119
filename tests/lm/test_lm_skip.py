"""An LM run's skips: skipped rows stay in their batch as rows that teach nothing, nothing else moves; resumed in a
fresh process on another world size, rolled back and skipped, replayed step by step, counted by the ledger."""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

import babelfeed
from babelfeed.errors import SkipError
from babelfeed.lm.iterator import LMIterator

SEED = int(os.environ.get("BABELFEED_TEST_SEED", random.randrange(1 << 30)))


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_skip")
    rng = np.random.default_rng(0)
    for name, n_docs in (("web", 60), ("books", 30)):
        with babelfeed.IndexedDatasetBuilder(root / name, np.int32, format="megatron") as b:
            for _ in range(n_docs):
                for _ in range(int(rng.integers(1, 4))):
                    b.add_item(rng.integers(10, 1000, int(rng.integers(3, 40))))
                b.end_document()
            b.finalize()
    return f"0.4 {root / 'web'} 0.6 {root / 'books'}", root


def build(path, **kw):
    return LMIterator.build(path[0], seq_len=16, global_batch=8, num_samples=400, split="100,0,0",
                            cache_dir=path[1] / "cache", **kw)


def assert_same(a, b, what):
    assert sorted(a) == sorted(b), what
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), f"{what}: {k}"


def test_skipped_rows_teach_nothing_and_nothing_else_moves(path):
    plain = list(build(path))
    it = build(path)
    got = [next(it) for _ in range(4)]
    it.skip(steps=range(7, 9), reason="spike")
    it.skip(ids=[8 * 12 + 3, 8 * 20])
    it.skip(where={"dataset": "books", "documents": range(0, 5)})
    got += list(it)
    assert len(got) == len(plain) == 50
    dropped = it.skips.dropped_samples(np.arange(400), it._where)
    assert dropped[48:64].all() and dropped[99] and dropped[160] and dropped.sum() > 18
    traced = {r["sample"]: r for step in range(1, 51) for r in it.trace(step)}
    for s in range(400):
        k, row = divmod(s, 8)
        a, b = plain[k], got[k]
        books = traced[s]["dataset"] == "books" and min(traced[s]["documents"]) < 5 and s >= 32
        assert bool(dropped[s]) == (48 <= s < 64 or s in (99, 160) or books), s
        assert traced[s]["skipped"] == bool(dropped[s])
        if dropped[s]:
            assert not b["loss_mask"][row].any() and not b["tokens"][row].any() and b["dataset"][row] == -1
        else:
            for key in a:
                assert np.array_equal(a[key][row], b[key][row]), (s, key)
    with pytest.raises(SkipError, match="already taken"):
        it.skip(steps=range(3, 5))
    with pytest.raises(SkipError, match="give where\\['dataset'\\] too"):
        build(path).skip(where={"documents": range(0, 3)})
    with pytest.raises(SkipError, match="did you mean"):
        build(path).skip(where={"dataset": "book"})


RESUME = r"""
import json, sys
import numpy as np
from babelfeed.lm.iterator import LMIterator
path, cache, state_file, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
its = [LMIterator.build(path, seq_len=16, global_batch=8, num_samples=400, split="100,0,0", cache_dir=cache,
                        rank=r, world_size=2) for r in range(2)]
state = json.load(open(state_file))
for it in its:
    it.set_state(state)
flat = {}
for k, pair in enumerate(zip(*its)):
    for key in pair[0]:
        flat[f"{k}:{key}"] = np.concatenate([pair[0][key], pair[1][key]])
np.savez(out, **flat)
print(json.dumps(its[0].ledger()))
"""


def test_skip_then_resume_in_a_fresh_process_on_two_ranks(path, tmp_path):
    rng = random.Random(SEED)
    cut = rng.randrange(6, 30)
    it = build(path)
    ref = [next(it) for _ in range(3)]
    it.skip(steps=range(cut - 1, cut + 4))
    it.skip(where={"dataset": "web", "documents": range(10, 20)})
    ref += [next(it) for _ in range(cut - 3)]
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(it.get_state()))
    ref += list(it)
    out = tmp_path / "resumed.npz"
    done = subprocess.run([sys.executable, "-c", RESUME, path[0], str(path[1] / "cache"), str(state_file), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = np.load(out)
    rest = ref[cut:]
    assert len({k.split(":")[0] for k in got.files}) == len(rest) == 50 - cut
    for k, batch in enumerate(rest):
        assert_same(batch, {key: got[f"{k}:{key}"] for key in batch}, f"seed {SEED}: step {cut + k + 1}")
    assert json.loads(done.stdout.splitlines()[-1]) == it.ledger()


def test_rollback_skip_replay_and_ledger(path):
    rng = random.Random(SEED + 1)
    s, k = rng.randrange(12, 40), rng.randrange(3, 8)  # (k >= 3: the skip starts after the state)
    saved, it = {}, build(path)
    for step in range(s):
        saved[step] = it.get_state()
        next(it)
        if step == 5:
            it.set_weights({"web": 1.0, "books": 3.0})
    rolled = build(path)
    rolled.set_state(json.loads(json.dumps(saved[s - k])))
    rolled.skip(steps=range(s - 2, s + 1), reason="spike")
    got = list(rolled)
    ref_it = build(path)
    ref = []
    for step in range(50):
        if step == 5 + 1:
            ref_it.set_weights({"web": 1.0, "books": 3.0})
        if step == s - k:
            ref_it.skip(steps=range(s - 2, s + 1), reason="spike")
        ref.append(next(ref_it))
    assert len(got) == 50 - (s - k)
    for i, batch in enumerate(got):
        assert_same(ref[s - k + i], batch, f"seed {SEED}: step {s - k + i + 1}")
    state = rolled.get_state()
    assert state == ref_it.get_state()
    # replay any step, any rank of any world size, from the final state
    probe = build(path)
    for step in rng.sample(range(1, 51), 8) + [s - 1, s]:
        assert_same(ref[step - 1], probe.batch_for_step(step, state), f"step {step}")
        halves = [probe.batch_for_step(step, state, rank=r, world_size=2) for r in range(2)]
        assert_same(ref[step - 1], {key: np.concatenate([halves[0][key], halves[1][key]]) for key in halves[0]},
                    f"step {step} on 2 ranks")
    # the ledger: served samples are the rows with a dataset, skipped ones the skipped steps' rows
    ledger = rolled.ledger()
    rows = np.concatenate([b["dataset"] for b in ref])
    assert ledger["ledger/web/samples"] == int((rows == 0).sum())
    assert ledger["ledger/books/samples"] == int((rows == 1).sum())
    assert ledger["ledger/skipped"] == 3 * 8 == ledger["ledger/web/skipped"] + ledger["ledger/books/skipped"]
    tokens = sum(int(b["loss_mask"].sum()) for b in ref)
    assert ledger["ledger/tokens"] >= tokens > 0


def test_the_ledger_and_replay_commands_on_an_lm_run(path, tmp_path, capsys):
    from babelfeed.cli import main

    it = build(path)
    for _ in range(6):
        next(it)
    it.skip(steps=range(9, 11), reason="spike")
    it.skip(where={"dataset": "books"}, reason="books out")
    batches = [next(it) for _ in range(8)]
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(it.get_state()))
    cfg_file = tmp_path / "lm.py"
    cfg_file.write_text(
        "import babelfeed\n\ndef get_config():\n    c = babelfeed.load_config('lm_packing')\n"
        f"    c.data_path = {path[0]!r}\n    c.seq_len, c.global_batch, c.num_samples = 16, 8, 400\n"
        f"    c.split, c.mode, c.cache_dir = '100,0,0', 'concat', {str(path[1] / 'cache')!r}\n    return c\n")
    capsys.readouterr()
    assert main(["ledger", str(cfg_file), "--state", str(state_file), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    ledger = it.ledger()
    assert {r["dataset"]: r["samples"] for r in report["rows"]} == {"web": ledger["ledger/web/samples"],
                                                                     "books": ledger["ledger/books/samples"]}
    assert report["totals"]["skipped"] == ledger["ledger/skipped"] == sum(s["samples"] for s in report["skips"])
    assert report["skips"][0]["samples"] == 16 and report["skips"][0]["what"] == "steps 9-10"
    books = sum(int((b["dataset"] == -1).sum()) for k, b in enumerate(batches) if k + 7 not in (9, 10))
    assert report["skips"][1]["samples"] == books > 0  # (rows of books outside the skipped steps)
    out = tmp_path / "b.npz"
    assert main(["replay", str(cfg_file), "--state", str(state_file), "--step", "12", "--world-size", "2",
                 "--rank", "1", "--out", str(out)]) == 0
    assert "lies after" not in capsys.readouterr().err
    assert main(["replay", str(cfg_file), "--state", str(state_file), "--step", "15",
                 "--out", str(tmp_path / "c.npz")]) == 0
    assert "warning: step 15 lies after the state's last step, 14:" in capsys.readouterr().err
    got = np.load(out)
    for key, value in batches[12 - 7].items():
        assert np.array_equal(got[key], value[4:]), key
