"""One state for every adapter: a checkpoint saved under any adapter restores under every other, and in
``babelfeed trace``, and the rest of the run is the in-process iterator's, every leaf; torchdata's
StatefulDataLoader over BatchDataset resumes exactly with 0 and 2 workers (it used to resume at batch 1 or 2
instead of 4, silently)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import babelfeed
from babelfeed.iterators.state import find_state
from babelfeed.errors import StateError
from golden import digest
from helpers import hist
from synthetic import config_for, make_data_bin

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helpers are
pytestmark = pytest.mark.filterwarnings("ignore:.*set_vital.*", "ignore:This DataLoader will create")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("state_everywhere")
    make_data_bin(r)
    return r


# Each adapter: save after `take` batches of rank `rank` of `world` (every rank in lockstep where it matters) and
# restore from a state, giving this rank's next batches. Run in a fresh process (the script below).
ADAPTERS = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import babelfeed
from golden import digest
from synthetic import config_for

CFG = config_for(sys.argv[2], batching__window=300, mixing__sampler=sys.argv[3], data__shards="all")


def npy(b):
    return {k: npy(v) for k, v in b.items()} if isinstance(b, dict) else (b.numpy() if hasattr(b, "numpy") else b)


def real(b):  # leave out the epoch's masked padding batches, which carry no sample
    return int(b["nsentences"]) > 0


def batches(kind, rank, world, state, n):
    if kind == "iterator":
        it = babelfeed.build_train_iterator(CFG, rank=rank, world_size=world)
        if state is not None:
            it.set_state(state)
        src, save = it, it.get_state
    elif kind == "torch_batches":
        from babelfeed.adapters.torch import TorchBatches
        it = TorchBatches(babelfeed.build_train_iterator(CFG, rank=rank, world_size=world), device="cpu")
        if state is not None:
            it.set_state(state)
        src, save = it, it.get_state
    elif kind.startswith("batch_loader"):
        from babelfeed.adapters.torch import BatchLoader
        it = BatchLoader(CFG, rank=rank, world_size=world, num_workers=int(kind[-1]))
        if state is not None:
            it.load_state_dict(state)
        src, save = iter(it), it.state_dict
    elif kind.startswith("stateful"):
        from torchdata.stateful_dataloader import StatefulDataLoader
        from babelfeed.adapters.torch import BatchDataset
        ds = BatchDataset(CFG, rank=rank, world_size=world, state=None if kind.endswith("_own") else state)
        it = StatefulDataLoader(ds, batch_size=None, num_workers=int(kind.split("_")[1]))
        if kind.endswith("_own") and state is not None:  # torchdata's own state, into a loader like it
            it.load_state_dict(state)
        src, save = iter(it), it.state_dict
    elif kind.startswith("grain"):
        from babelfeed.adapters.grain import EpochsDataset
        it = iter(EpochsDataset(CFG, rank=rank, world_size=world, num_workers=int(kind[-1])))
        if state is not None:
            it.set_state(state)
        src, save = it, it.get_state
    out = []
    while len(out) < n:
        b = npy(next(src))
        if real(b):
            out.append(digest(b))
    return out, json.loads(json.dumps(save(), default=str))


out = []
for job in json.loads(sys.argv[4]):
    if job["do"] == "save":
        got, state = batches(job["kind"], job["rank"], job["world"], None, job["take"])
        out.append({"batches": got, "state": state})
    else:
        out.append({k: batches(k, job["rank"], job["world"], job["state"], job["take"])[0] for k in job["kinds"]})
print(json.dumps(out))
"""

SOURCES = ["iterator", "torch_batches", "batch_loader_0", "batch_loader_2", "grain_0", "stateful_0_own",
           "stateful_2_own"]
TARGETS = ["iterator", "torch_batches", "batch_loader_0", "batch_loader_2", "grain_0", "stateful_0"]


def run(script, root, sampler, jobs):
    """The jobs in one fresh process."""
    out = subprocess.run([sys.executable, str(script), HERE, str(root), sampler, json.dumps(jobs)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def config(root, sampler):
    return config_for(root, batching__window=300, mixing__sampler=sampler, data__shards="all")


@pytest.mark.parametrize("sampler", ["stratified", "stream"])
def test_a_state_saved_under_any_adapter_restores_under_every_other_and_in_trace(root, tmp_path, sampler, capsys):
    pytest.importorskip("torchdata")
    script = tmp_path / "adapters.py"
    script.write_text(ADAPTERS)
    cfg = config(root, sampler)
    epoch1 = list(babelfeed.build_train_iterator(cfg))
    ref = [digest(b) for b in epoch1] + [digest(b) for b in babelfeed.build_train_iterator(cfg, epoch=2)]
    rng = np.random.default_rng(31 if sampler == "stream" else 32)
    takes = {kind: int(rng.integers(1, len(epoch1) - 6)) for kind in SOURCES}
    # each adapter saves at a random batch (one process), every state is restored by every other adapter (a
    # second process): the next 5 batches, every leaf
    saved = run(script, root, sampler, [{"do": "save", "kind": k, "rank": 0, "world": 1, "take": takes[k]}
                                        for k in SOURCES])
    states = {}
    for kind, got in zip(SOURCES, saved):
        assert got["batches"] == ref[:takes[kind]], kind
        states[kind] = got["state"]
        found = find_state(got["state"])
        assert found["fingerprint"] and found["epoch"] == 1, kind
    jobs = [{"do": "restore", "kinds": TARGETS + ([k] if k.startswith("stateful") else []), "rank": 0, "world": 1,
             "take": 5, "state": states[k]} for k in SOURCES]
    for kind, got in zip(SOURCES, run(script, root, sampler, jobs)):
        for target, batches in got.items():
            assert batches == ref[takes[kind]:takes[kind] + 5], (kind, target, takes[kind])
    # and babelfeed trace takes each: the step of the last batch taken (one rank: a step is a batch)
    cfg_file = tmp_path / "cfg.py"
    cfg_file.write_text(f"import sys\nsys.path.insert(0, {HERE!r})\nfrom test_state_everywhere import config\n"
                        f"def get_config():\n    return config({str(root)!r}, {sampler!r})\n")
    from babelfeed.cli import main

    for kind, state in states.items():
        path = tmp_path / f"{kind}.json"
        path.write_text(json.dumps(state))
        capsys.readouterr()
        assert main(["trace", str(cfg_file), "--state", str(path), "--step", str(takes[kind]), "--json"]) == 0
        ids = sorted(r["id"] for r in json.loads(capsys.readouterr().out))
        batch = epoch1[takes[kind] - 1]
        assert ids == sorted(batch["id"][batch["weight"] > 0].tolist()), kind


def test_a_state_restores_on_another_world_size_under_another_adapter(root, tmp_path):
    """Saved by BatchLoader on 1 rank, restored on 3 ranks by the in-process iterator, BatchLoader with 2 workers
    and StatefulDataLoader: every rank's batches equal the in-process iterators' of 3 ranks."""
    pytest.importorskip("torchdata")
    script = tmp_path / "adapters.py"
    script.write_text(ADAPTERS)
    state = run(script, root, "stream", [{"do": "save", "kind": "batch_loader_0", "rank": 0, "world": 1,
                                          "take": 7}])[0]["state"]
    cfg = config(root, "stream")
    wants = []
    for rank in range(3):
        it = babelfeed.build_train_iterator(cfg, rank=rank, world_size=3)
        it.set_state(state)
        want = []
        while len(want) < 4:
            b = next(it)
            if b["nsentences"]:
                want.append(digest(b))
        wants.append(want)
    jobs = [{"do": "restore", "kinds": ["iterator", "batch_loader_2", "stateful_0"], "rank": r, "world": 3,
             "take": 4, "state": state} for r in range(3)]
    for rank, out in enumerate(run(script, root, "stream", jobs)):
        for target, batches in out.items():
            assert batches == wants[rank], (rank, target)


def test_checkpoints_that_hold_no_state_or_several_are_refused_by_name(root):
    state = babelfeed.build_train_iterator(config_for(root)).get_state()
    assert find_state({"data": state, "model": {"step": 3}}) is state
    with pytest.raises(StateError, match=r"holds no babelfeed state \(it has \['model'\]\)"):
        find_state({"model": {"step": 3}})
    with pytest.raises(StateError, match="holds 2 babelfeed states"):
        find_state({"a": state, "b": state})
    with pytest.raises(StateError, match="grain's own mp_prefetch state"):
        find_state({"workers_state": {"0": {"next_index": 3}}, "iterations_to_skip": {}})
    with pytest.raises(StateError, match="json.loads it first"):
        find_state(json.dumps(state))
    with pytest.raises(StateError, match="snapshot_every_n_steps=1"):
        find_state({"_snapshot": {"_worker_snapshots": {}}, "_steps_since_snapshot": 2})
    it = babelfeed.build_train_iterator(config_for(root))
    with pytest.raises(StateError, match="holds no babelfeed state"):
        it.set_state({"model": 1})


def test_a_stateful_dataloader_checkpoint_of_two_ranks_traces_and_restores_on_their_world_size(root, tmp_path,
                                                                                                capsys):
    """torchdata's 2-worker checkpoint on rank 0 of 2: babelfeed trace takes the world size from it (it answered
    for 1 rank, silently), and BatchLoader on 3 ranks counts the steps already taken on 2."""
    pytest.importorskip("torchdata")
    from torchdata.stateful_dataloader import StatefulDataLoader

    from babelfeed.adapters.torch import BatchDataset, BatchLoader
    from babelfeed.cli import main

    cfg = config(root, "stream")
    dl = StatefulDataLoader(BatchDataset(cfg, rank=0, world_size=2), batch_size=None, num_workers=2,
                            multiprocessing_context="forkserver")
    for _ in zip(range(5), dl):
        pass
    state = json.loads(json.dumps(dl.state_dict(), default=str))
    path = tmp_path / "sdl.json"
    path.write_text(json.dumps(state))
    cfg_file = tmp_path / "cfg.py"
    cfg_file.write_text(f"import sys\nsys.path.insert(0, {HERE!r})\nfrom test_state_everywhere import config\n"
                        f"def get_config():\n    return config({str(root)!r}, 'stream')\n")
    capsys.readouterr()
    assert main(["trace", str(cfg_file), "--state", str(path), "--step", "5", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted({r["batch"] for r in rows}) == [8, 9]
    ranks = [babelfeed.build_train_iterator(cfg, rank=r, world_size=2) for r in range(2)]
    step5 = [[next(it) for _ in range(5)][-1] for it in ranks]
    assert [sorted(r["id"] for r in rows if r["rank"] == k) for k in range(2)] == [
        sorted(b["id"][b["weight"] > 0].tolist()) for b in step5]
    loader = BatchLoader(cfg, rank=0, world_size=3)
    loader.load_state_dict(state)
    saved = loader.state_dict()
    assert (saved["consumed"], saved["total_steps"]) == (10, 5) and hist(saved).steps == [[0, 1, 0, 2], [5, 1, 10, 3]]
