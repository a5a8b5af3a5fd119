"""The ledger (what every rank together consumed, per stream) against a recount from the served batches, across
ranks, epochs, samplers and resumes in a fresh process on another world size; ids back to their files; the
samples of a training step (``trace``), as the API and the ``babelfeed trace`` command give them."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import babelfeed
from synthetic import config_for, make_data_bin
from babelfeed.errors import StateError, UsageError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helpers are
PAD = 1
FIELDS = ("samples", "src_tokens", "tgt_tokens")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("ledger")
    make_data_bin(r)
    return r


def recount(batches, keys) -> dict:
    """Per stream [samples, source tokens, target tokens] of the real rows (weight > 0) of served batches."""
    out = {k: [0, 0, 0] for k in keys}
    for b in batches:
        real = np.asarray(b["weight"]) > 0
        src = np.asarray(b["net_input"]["src_lengths"])[real]
        tgt = (np.asarray(b["target"])[real] != PAD).sum(1)
        for d, s, t in zip(np.asarray(b["direction"])[real].tolist(), src.tolist(), tgt.tolist()):
            out[keys[d]][0] += 1
            out[keys[d]][1] += s
            out[keys[d]][2] += t
    return out


def of_ledger(led: dict, keys) -> dict:
    return {k: [led[f"ledger/{k}/{f}"] for f in FIELDS] for k in keys}


def add(a: dict, b: dict) -> dict:
    return {k: [x + y for x, y in zip(a[k], b[k])] for k in a}


CASES = {"auto": {}, "stream": {"mixing__sampler": "stream", "data__shards": "all"},
         "static": {"batching__num_shapes": 3}, "temperature1": {"mixing__temperature": 1.0}}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_ledger_is_what_every_rank_served(root, case):
    """W ranks walk 2.5 epochs in lockstep; at random steps every rank's ledger equals the recount of all
    ranks' served batches (masked rows and epoch-padding batches left out), stream by stream, every field."""
    cfg = config_for(root, batching__window=300, **CASES[case])
    rng = np.random.default_rng(len(case))
    world = int(rng.integers(1, 4))
    its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=world) for r in range(world)]
    keys = its[0].planner.keys
    steps = int(2.5 * len(its[0]))
    checks = set(rng.choice(np.arange(1, steps), 6, replace=False).tolist()) | {steps}
    served, taken, checked = [], 0, 0
    while taken < steps:
        step = [next(it, None) for it in its]
        if step[0] is None:  # an epoch ended on every rank at once
            assert all(b is None for b in step)
            continue
        served += step
        taken += 1
        if taken in checks:
            ledgers = [it.ledger() for it in its]
            assert all(led == ledgers[0] for led in ledgers)
            assert of_ledger(ledgers[0], keys) == recount(served, keys), (case, world, taken)
            assert ledgers[0]["ledger/step"] == taken and ledgers[0]["ledger/samples"] == sum(
                v[0] for v in recount(served, keys).values())
            checked += 1
    assert checked == len(checks) and its[0].epoch == 3
    led = its[0].ledger()
    rows = {k: sum(len(c) for c in its[0].planner.sources.components if c.key == k) for k in keys}
    assert all(led[f"ledger/{k}/passes"] == led[f"ledger/{k}/samples"] // rows[k] for k in keys)
    assert max(led[f"ledger/{k}/passes"] for k in keys) >= (1 if case == "temperature1" else 2)  # up-sampled


RESUME = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import babelfeed
from synthetic import config_for
from test_ledger import CASES, recount, of_ledger

case, world, steps, state = json.loads(sys.argv[3])
cfg = config_for(sys.argv[2], batching__window=300, **CASES[case])
its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=world) for r in range(world)]
for it in its:
    it.set_state(state)
keys = its[0].planner.keys
served, taken = [], 0
while taken < steps:
    step = [next(it, None) for it in its]
    if step[0] is None:
        continue
    served += step
    taken += 1
print(json.dumps({"ledger": of_ledger(its[0].ledger(), keys), "rest": recount(served, keys),
                  "same": all(it.ledger() == its[0].ledger() for it in its)}))
"""


@pytest.mark.parametrize("case", ["auto", "stream"])
def test_the_ledger_continues_after_a_resume_on_another_world_size(root, tmp_path, case):
    """Saved after a random number of steps on W ranks, resumed in a fresh process on W' ranks: the ledger
    there equals the recount of the batches served before the save plus those served after; a state without its
    ledger field (an older babelfeed's) gives the same ledger, counted from the plan."""
    cfg = config_for(root, batching__window=300, **CASES[case])
    script = tmp_path / "resume_ledger.py"
    script.write_text(RESUME)
    rng = np.random.default_rng(31 if case == "auto" else 32)
    for w, w2 in ((2, 3), (3, 1)):
        its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=w) for r in range(w)]
        keys = its[0].planner.keys
        head_steps = int(rng.integers(1, 2 * len(its[0])))
        served, taken = [], 0
        while taken < head_steps:
            step = [next(it, None) for it in its]
            if step[0] is None:
                continue
            served += step
            taken += 1
        state = its[0].get_state()
        assert json.loads(json.dumps(state)) == state and "ledger" in state
        head = recount(served, keys)
        for s in (state, {k: v for k, v in state.items() if k != "ledger"}):
            out = subprocess.run([sys.executable, str(script), HERE, str(root),
                                  json.dumps([case, w2, int(rng.integers(1, 12)), s])],
                                 capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, out.stderr[-3000:]
            got = json.loads(out.stdout.strip().splitlines()[-1])
            assert got["same"] and got["ledger"] == add(head, got["rest"]), (case, w, w2, head_steps)


def test_a_malformed_ledger_in_a_state_is_refused_by_name(root):
    it = babelfeed.build_train_iterator(config_for(root))
    next(it)
    state = it.get_state()
    fresh = babelfeed.build_train_iterator(config_for(root))
    with pytest.raises(StateError, match="must count exactly the streams"):
        fresh.set_state({**state, "ledger": {**state["ledger"], "samples": {"aaa-bbb": 1}}})
    bad = json.loads(json.dumps(state))
    bad["ledger"]["src_tokens"]["aaa-ccc"] = -4
    with pytest.raises(StateError, match=r"ledger\['src_tokens'\]\['aaa-ccc'\] must be an integer in \[0, 2\*\*62\)"):
        fresh.set_state(bad)


def test_ids_map_back_to_the_record_they_were_read_from(root):
    """Every real row of a few batches: the (stream, shard, row) its id names holds exactly the tokens the batch
    has there (the target row, stored with its </s>); -1 (an epoch-padding row) gives None; a wrong id raises."""
    cfg = config_for(root, data__shards="all")
    it = babelfeed.build_train_iterator(cfg, world_size=1)
    comps = {(c.key, c.shard): c for c in it.planner.sources.components}
    seen = set()
    for _, b in zip(range(6), it):
        where = it.describe_ids(b["id"])
        assert len(where) == len(b["id"])
        for row, (w, tgt, weight) in enumerate(zip(where, b["target"], b["weight"])):
            stored = np.asarray(comps[(w["stream"], w["shard"])].tgt[w["row"]])
            real = tgt[tgt != PAD]
            assert np.array_equal(real[-len(stored):], stored), (w, real, stored)
            assert w["corpus"] == w["stream"] and w["task"] == w["stream"]
            seen.add((w["stream"], w["shard"]))
    assert len({s for s, _ in seen}) >= 2 and len({sh for _, sh in seen}) == 2
    assert it.describe_ids([-1]) == [None]
    with pytest.raises(UsageError, match="is not an id of this data"):
        it.describe_ids([10 ** 9])


def test_trace_lists_the_samples_of_a_step_on_every_rank(root, tmp_path):
    """For random steps of a 2-epoch run on 3 ranks (some after a resume whose state anchors the count),
    trace(step) holds exactly the ids the ranks' batches of that step held, rank by rank; the command prints
    the same as JSON, and a table."""
    cfg = config_for(root, batching__window=300)
    world = 3
    its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=world) for r in range(world)]
    by_step, taken, state = {}, 0, None
    n1 = len(its[0])
    while its[0].epoch < 3:
        step = [next(it, None) for it in its]
        if step[0] is None:
            continue
        taken += 1
        by_step[taken] = [sorted(b["id"][b["weight"] > 0].tolist()) for b in step]
        if taken == n1 + 2:
            state = its[0].get_state()  # in epoch 2: the count is anchored there
    rng = np.random.default_rng(8)
    probe = babelfeed.build_train_iterator(cfg, world_size=world)
    assert state is not None and state["epoch"] == 2
    for step in sorted({1, n1, n1 + 1, taken, *rng.choice(np.arange(1, taken + 1), 5).tolist()}):
        for anchor in (None, state):
            rows = probe.trace(int(step), anchor)
            got = [sorted(r["id"] for r in rows if r["rank"] == k) for k in range(world)]
            assert got == by_step[step], (step, anchor is not None)
    with pytest.raises(UsageError, match="steps count from 1"):
        probe.trace(0)
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps({"data": state, "step": 12}))
    cfg_file = tmp_path / "cfg.py"
    cfg_file.write_text(
        "import sys\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "from synthetic import config_for\n"
        f"def get_config():\n    return config_for({str(root)!r}, batching__window=300)\n")
    step = taken - 1
    cmd = [sys.executable, "-m", "babelfeed.cli", "trace", str(cfg_file), "--state", str(state_file), "--step",
           str(step), "--world-size", str(world)]
    out = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [sorted(r["id"] for r in rows if r["rank"] == k) for k in range(world)] == by_step[step]
    table = subprocess.run(cmd + ["--decode"], capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith(f"step {step}: epoch 2, {len(rows)} samples (world size 3")
    assert table.stdout.count("target: ") == len(rows)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_the_adapters_report_the_ledger_of_what_the_loop_received(root):
    """TorchBatches (a read-ahead thread), BatchLoader (2 DataLoader workers) and grain's EpochsDataset report,
    after k batches across an epoch boundary, the ledger of exactly those k steps (not the read-ahead): equal to
    the plain iterator's after k steps and to the recount of what they handed out."""
    pytest.importorskip("torch")
    pytest.importorskip("grain")
    from babelfeed.adapters.grain import EpochsDataset
    from babelfeed.adapters.torch import BatchLoader, TorchBatches

    cfg = config_for(root, batching__window=300)
    plain = babelfeed.build_train_iterator(cfg)
    keys = plain.planner.keys
    k = len(plain) + 3  # into epoch 2
    want = []
    while len(want) < k:
        b = next(plain, None)
        if b is not None:
            want.append(b)
    expected = plain.ledger()
    assert of_ledger(expected, keys) == recount(want, keys)

    def numpy(b):
        return {key: numpy(v) for key, v in b.items()} if isinstance(b, dict) else (
            v.numpy() if hasattr(v := b, "numpy") else v)

    tb = TorchBatches(babelfeed.build_train_iterator(cfg), device="cpu", prefetch=3)
    got = []
    while len(got) < k:
        b = next(tb, None)
        if b is not None:
            got.append(numpy(b))
    assert tb.ledger() == expected and of_ledger(tb.ledger(), keys) == recount(got, keys)
    tb.close()

    loader = BatchLoader(cfg, num_workers=2, multiprocessing_context="forkserver")
    got = []
    for _ in range(2):
        for b in loader:
            got.append(numpy(b))
            if len(got) == k:
                break
        if len(got) == k:
            break
    led = loader.ledger()
    assert of_ledger(led, keys) == recount(got, keys) == of_ledger(expected, keys)
    assert led["ledger/epoch"] == 2 and led["ledger/step"] == expected["ledger/step"]  # the run's steps, as in-process

    it = iter(EpochsDataset(cfg, num_workers=0, num_epochs=2))
    got = [next(it) for _ in range(k)]
    assert of_ledger(it.ledger(), keys) == recount(got, keys) == of_ledger(expected, keys)
