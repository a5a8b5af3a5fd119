"""A skip made through any adapter (the read-ahead prefetcher, BatchLoader with and without workers, grain's
EpochsDataset) serves what the in-process iterator serves after the same skip, every leaf; the state it saves
carries the skip to every other adapter, in a fresh process."""

import json
import os
import subprocess
import sys

import pytest

import babelfeed
from golden import digest
from synthetic import config_for, make_data_bin
from babelfeed.errors import CallOrderError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
pytestmark = pytest.mark.filterwarnings("ignore:.*set_vital.*", "ignore:This DataLoader will create")

SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import babelfeed
from golden import digest
from synthetic import config_for

CFG = config_for(sys.argv[2], batching__window=300, mixing__sampler="stream", data__shards="all")
SKIP = json.loads(sys.argv[3])


def npy(b):
    return {k: npy(v) for k, v in b.items()} if isinstance(b, dict) else (b.numpy() if hasattr(b, "numpy") else b)


def open_(kind, state):
    if kind == "torch_batches":
        from babelfeed.adapters.torch import TorchBatches
        it = TorchBatches(babelfeed.build_train_iterator(CFG), device="cpu")
        it.set_state(state)
        return it, it, it.get_state
    if kind.startswith("batch_loader"):
        from babelfeed.adapters.torch import BatchLoader
        it = BatchLoader(CFG, num_workers=int(kind[-1]))
        it.load_state_dict(state)
        return it, None, it.state_dict
    from babelfeed.adapters.grain import EpochsDataset
    it = iter(EpochsDataset(CFG, num_workers=int(kind[-1])))
    it.set_state(state)
    return it, it, it.get_state


out = {}
for kind in sys.argv[5].split(","):
    state = json.loads(open(sys.argv[4]).read())
    obj, source, save = open_(kind, state)
    if source is not None:
        next(source)  # a batch read (the read-ahead runs on), then the skip: made at the next step
    obj.skip(steps=range(*SKIP["steps"]), reason="spike")
    obj.skip(where={"corpus": SKIP["corpus"]})
    src = iter(obj) if source is None else source
    got = [digest(npy(next(src))) for _ in range(12)]
    out[kind] = {"batches": got, "state": json.loads(json.dumps(save(), default=str))}
print(json.dumps(out))
"""


def test_a_skip_through_any_adapter_is_the_iterators(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("grain")
    root = tmp_path / "data"
    make_data_bin(root)
    cfg = config_for(root, batching__window=300, mixing__sampler="stream", data__shards="all")
    it = babelfeed.build_train_iterator(cfg)
    for _ in range(4):
        next(it)
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(it.get_state()))
    corpus = it.planner.sources.streams[1].key
    skip = {"steps": [9, 12], "corpus": corpus}

    def reference(read_first: bool):
        ref = babelfeed.build_train_iterator(cfg)
        ref.set_state(json.loads(state_file.read_text()))
        if read_first:
            next(ref)
        ref.skip(steps=range(9, 12), reason="spike")
        ref.skip(where={"corpus": corpus})
        return [digest(next(ref)) for _ in range(12)], ref

    script = tmp_path / "skip.py"
    script.write_text(SCRIPT)
    kinds = ["torch_batches", "batch_loader_0", "batch_loader_2", "grain_0"]
    done = subprocess.run([sys.executable, str(script), HERE, str(root), json.dumps(skip), str(state_file),
                           ",".join(kinds)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for kind in kinds:
        want, ref = reference(read_first=kind != "batch_loader_0" and kind != "batch_loader_2")
        assert got[kind]["batches"] == want, kind
        saved = babelfeed.iterators.state.find_state(got[kind]["state"])
        skips = [e for e in saved["history"] if e["event"] == "skip"]
        assert [e.get("steps") or e.get("where") for e in skips] == [[9, 12], {"corpus": [corpus]}], kind
        # the state it saved restores under the in-process iterator, skips included
        again = babelfeed.build_train_iterator(cfg)
        again.set_state(saved)
        assert [digest(next(again)) for _ in range(3)] == [digest(next(ref)) for _ in range(3)], kind


def test_a_skip_in_the_middle_of_a_pass_applies_from_the_next_batch(tmp_path):
    """A skip made during a pass drops the read-ahead: the next batch is the skipped run's (the skipped step's
    rows gone), as a loader that made the skip at that point serves; load_state_dict is still refused while a pass
    runs (its workers would go on serving the old position)."""
    pytest.importorskip("torch")
    from babelfeed.adapters.torch import BatchLoader

    root = tmp_path / "data"
    make_data_bin(root)
    cfg = config_for(root, mixing__sampler="stream", data__shards="all")
    loader = BatchLoader(cfg)
    got = []
    for k, batch in enumerate(loader):
        got.append(batch["id"].tolist())
        if k == 0:
            assert loader.skip(steps=range(3, 4))["steps"] == [3, 4]  # during the pass: from the next batch
        if k == 3:
            break
    twin = BatchLoader(cfg)
    want = []
    for k, batch in enumerate(twin):
        want.append(batch["id"].tolist())
        if k == 0:
            break
    twin.skip(steps=range(3, 4))  # between passes: the same skip, the same batches
    for k, batch in enumerate(twin):
        want.append(batch["id"].tolist())
        if k == 2:
            break
    assert got == want and all(i == -1 for i in got[2])  # step 3: every row skipped
    state = loader.state_dict()
    running = iter(loader)
    next(running)
    with pytest.raises(CallOrderError, match="load_state_dict while a pass.*close"):
        loader.load_state_dict(state)  # (it used to be taken, and the running pass served the old position)
    running.close()
    loader.load_state_dict(state)
