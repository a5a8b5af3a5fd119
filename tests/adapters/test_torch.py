"""babelfeed.adapters.torch on the CPU: tensors, prefetch state, DataLoader workers, a 2-process gloo run."""

import json
import os
import socket
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch

import babelfeed
from babelfeed.adapters.torch import BatchDataset, BatchLoader, TorchBatches, to_torch
from helpers import hist
from synthetic import config_for, make_data_bin
from helpers import decode_ids
from babelfeed.errors import ConfigError, StateError, StateMismatch, UsageError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helpers are
# Workers come from a forkserver: other tests load JAX (multithreaded) into this process, and forking it is unsafe.
MP = "forkserver"


def loader_for(dataset, workers):
    return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers,
                                       multiprocessing_context=MP if workers else None)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("torchbin")
    make_data_bin(r)
    return r


def flat_ids(batches):
    return [int(i) for b in batches for i, w in zip(b["id"], b["weight"]) if w > 0]


def test_tensors_and_prefetch_state(root):
    cfg = config_for(root)
    reference = list(babelfeed.build_train_iterator(cfg))
    got = list(TorchBatches(babelfeed.build_train_iterator(cfg), device="cpu", prefetch=3))
    assert len(got) == len(reference)
    for t, n in zip(got, reference):
        assert isinstance(t["net_input"]["src_tokens"], torch.Tensor) and t["net_input"]["src_tokens"].dtype == torch.int64
        assert np.array_equal(t["net_input"]["src_tokens"].numpy(), n["net_input"]["src_tokens"])
        assert np.array_equal(t["target"].numpy(), n["target"]) and t["ntokens"] == n["ntokens"]
    a = TorchBatches(babelfeed.build_train_iterator(cfg), device="cpu", prefetch=4)
    head = [next(a) for _ in range(5)]
    b = TorchBatches(babelfeed.build_train_iterator(cfg), device="cpu")
    b.set_state(a.get_state())
    rest = list(b)
    assert flat_ids(head + rest) == flat_ids(reference)
    assert to_torch({"x": np.arange(3)})["x"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_workers_cover_the_epoch_once(root, workers):
    cfg = config_for(root, mixing__sampler="concat", data__shards="all")
    per_rank = []
    for rank in range(2):
        ds = BatchDataset(cfg, rank=rank, world_size=2, num_workers=workers or None)
        per_rank.append(list(loader_for(ds, workers)))
    assert len(per_rank[0]) == len(per_rank[1]) == len(BatchDataset(cfg, rank=0, world_size=2,
                                                                      num_workers=workers or None))
    who = decode_ids(babelfeed.build_train_iterator(cfg))
    seen = Counter(who(i) for b in per_rank[0] + per_rank[1] for i, w in zip(b["id"].tolist(), b["weight"].tolist())
                   if w > 0)
    assert max(seen.values()) == 1 and sum(seen.values()) == 600 + 500 + 120 + 80 + 12 + 9


GLOO = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method=sys.argv[3], rank=int(sys.argv[4]), world_size=2)
from babelfeed.adapters.torch import BatchDataset
from synthetic import config_for
cfg = config_for(sys.argv[2], mixing__sampler="concat", data__shards="all")
ds = BatchDataset(cfg)  # rank and world size from torch.distributed
assert (ds.rank, ds.world_size) == (dist.get_rank(), 2)
ids = [int(i) for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
       for i, w in zip(b["id"].tolist(), b["weight"].tolist()) if w > 0]
steps = torch.tensor([len(ids)])
everyone = [None, None]
dist.all_gather_object(everyone, ids)
print(json.dumps({"rank": dist.get_rank(), "all": everyone}))
dist.destroy_process_group()
"""


def test_two_process_gloo(root):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", GLOO, HERE, str(root), f"tcp://127.0.0.1:{port}", str(r)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=240)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    everyone = outs[0]["all"]
    assert everyone == outs[1]["all"]
    union = everyone[0] + everyone[1]
    assert len(union) == len(set(union)) == 600 + 500 + 120 + 80 + 12 + 9


def as_numpy(batch):
    if isinstance(batch, dict):
        return {k: as_numpy(v) for k, v in batch.items()}
    return batch.numpy() if isinstance(batch, torch.Tensor) else batch


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers", [0, 2, 3])
def test_dataloader_serves_exactly_the_in_process_batches(root, workers):
    """Whatever the worker count, a rank's DataLoader yields the batches its iterator yields in-process, in
    order, every leaf equal."""
    from golden import digest

    cfg = config_for(root, batching__window=300)
    for rank in range(2):
        want = [digest(b) for b in babelfeed.build_train_iterator(cfg, rank=rank, world_size=2)]
        got = [digest(as_numpy(b)) for b in loader_for(BatchDataset(cfg, rank=rank, world_size=2), workers)]
        assert got == want


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_worker_ring_is_released_and_refuses_a_batch_written_over(root, tmp_path):
    import babelfeed.adapters.torch as bf_torch
    from helpers import TouchEach, wait_for_files

    cfg = config_for(root)
    list(loader_for(BatchDataset(cfg), 2))
    assert bf_torch._RINGS == {}  # each worker's shared slots are dropped after its last batch
    # one slot and a DataLoader allowed 4 batches ahead: the worker writes over a batch not yet copied out
    dl = torch.utils.data.DataLoader(BatchDataset(cfg, ring_slots=1, transform=TouchEach(str(tmp_path))),
                                     batch_size=None, num_workers=1, prefetch_factor=4, multiprocessing_context=MP)
    it = iter(dl)
    wait_for_files(str(tmp_path), 3)  # the third batch made: the second is in the one slot, over the first
    with pytest.raises(ConfigError, match="wrote over"):
        for _ in range(4):
            next(it)
    del it


RESUME = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import torch
from golden import digest
from babelfeed.adapters.torch import BatchDataset
from synthetic import config_for


def as_numpy(b):
    return {k: as_numpy(v) for k, v in b.items()} if isinstance(b, dict) else (
        b.numpy() if isinstance(b, torch.Tensor) else b)


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore", "This DataLoader will create")  # 3 workers on 2 cores, on purpose
    cfg = config_for(sys.argv[2], batching__window=300)
    out = []
    for workers, rank, world, state in json.loads(sys.argv[3]):
        ds = BatchDataset(cfg, rank=rank, world_size=world, state=state)
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
        got = [digest(as_numpy(b)) for b in dl]
        out.append({"len": len(dl), "batches": got})
    print(json.dumps(out))
"""


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_dataloader_resumes_in_a_fresh_process_with_0_1_2_workers(root, tmp_path):
    """States taken at random cut points resume in a fresh process with 0, 1, 2 or 3 workers (3 on 2 cores):
    the batches after the cut equal the in-process ones, every leaf, and len(DataLoader) is the count yielded."""
    from golden import digest

    cfg = config_for(root, batching__window=300)
    rng = np.random.default_rng(7)
    jobs, want = [], []
    for rank, world in ((0, 1), (1, 2)):
        full = [digest(b) for b in babelfeed.build_train_iterator(cfg, rank=rank, world_size=world)]
        for workers in (0, 1, 2, 3):
            cuts = sorted(rng.choice(np.arange(1, len(full) - 1), 2, replace=False))
            cuts = [0, cuts[0]] if workers == 3 else cuts
            for k in cuts:
                state = BatchDataset(cfg, rank=rank, world_size=world).state_dict(int(k))
                jobs.append((workers, rank, world, json.loads(json.dumps(state))))
                want.append(full[int(k):])
    script = tmp_path / "resume_torch.py"
    script.write_text(RESUME)
    out = subprocess.run([sys.executable, str(script), HERE, str(root), json.dumps(jobs)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(got) == len(want) == len(jobs)
    for job, w, g in zip(jobs, want, got):
        assert g["len"] == len(g["batches"]) == len(w), job  # len(DataLoader) is what it yields
        assert g["batches"] == w, job


@pytest.mark.parametrize("sampler", ["auto", "stream"])
def test_elastic_resume_at_many_cut_points(root, tmp_path, sampler):
    """Saved at world size W after a random number of steps, resumed at W' in a fresh process: the global
    stream (every rank's batches of each step, in rank order, epoch padding left out) is the W=1 stream, every
    leaf of every batch."""
    from golden import digest

    extra = {"data__shards": "all"} if sampler == "stream" else {}  # streams read every shard
    cfg = config_for(root, batching__window=300, mixing__sampler=sampler, **extra)
    ref = [digest(b) for b in babelfeed.build_train_iterator(cfg)]
    rng = np.random.default_rng(3 if sampler == "stream" else 4)
    jobs, heads = [], []
    for _ in range(6):
        w, w2 = (int(x) for x in rng.choice([1, 2, 3, 4], 2, replace=False))
        its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=w) for r in range(w)]
        steps = int(rng.integers(1, len(its[0])))
        head = [digest(next(it)) for _ in range(steps) for it in its]
        states = [it.get_state() for it in its]
        assert all(s == states[0] for s in states)
        jobs.append((w2, states[0]))
        heads.append(head)
    code = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import babelfeed
from golden import digest
from synthetic import config_for
extra = {"data__shards": "all"} if sys.argv[3] == "stream" else {}
cfg = config_for(sys.argv[2], batching__window=300, mixing__sampler=sys.argv[3], **extra)
out = []
for world, state in json.loads(sys.argv[4]):
    its = [babelfeed.build_train_iterator(cfg, rank=r, world_size=world) for r in range(world)]
    for it in its:
        it.set_state(state)
    steps = [list(it) for it in its]
    assert len({len(s) for s in steps}) == 1
    out.append([digest(b) for step in zip(*steps) for b in step if b["nsentences"] or b["id"].min() >= 0])
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", code, HERE, str(root), sampler, json.dumps(jobs)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    rests = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(rests) == len(heads) == 6
    for (w2, state), head, rest in zip(jobs, heads, rests):
        assert head + rest == ref, (w2, state)


LOADER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from golden import digest
from babelfeed.adapters.torch import BatchLoader
from synthetic import config_for


def as_numpy(b):
    return {k: as_numpy(v) for k, v in b.items()} if isinstance(b, dict) else (
        b.numpy() if isinstance(b, torch.Tensor) else b)


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore", "This DataLoader will create")
    results = []
    for workers, take, state in json.loads(sys.argv[3]):  # (each job its own loader)
        loader = BatchLoader(config_for(sys.argv[2], batching__window=300), num_workers=workers,
                             multiprocessing_context="forkserver" if workers else None)
        if state is not None:
            loader.load_state_dict(state)
        passes = []
        for _ in range(2 if take is None else 1):
            n = len(loader)
            got = []
            for batch in loader:
                got.append(digest(as_numpy(batch)))
                if take is not None and len(got) == take:
                    break
            passes.append({"len": n, "batches": got, "epoch_after": loader.epoch})
        results.append({"passes": passes, "state": loader.state_dict()})
    print(json.dumps(results))
"""


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_batch_loader_state_counts_what_the_loop_received_and_resumes_with_other_workers(root, tmp_path):
    """The loop breaks after k batches (workers have made more by then); state_dict() in that process, then
    load_state_dict() in a fresh process with another num_workers serves the rest of epoch 1, then epoch 2
    whole: every leaf equal to the in-process iterator, and len(loader) the count each pass yields."""
    from golden import digest

    cfg = config_for(root, batching__window=300)
    it = babelfeed.build_train_iterator(cfg)
    epoch1 = [digest(b) for b in it]
    epoch2 = [digest(b) for b in it]
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    rng = np.random.default_rng(11)

    def run(*jobs):
        out = subprocess.run([sys.executable, str(script), HERE, str(root), json.dumps(jobs)],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    pairs = ((0, 2), (2, 0), (1, 3))
    cuts = [int(rng.integers(1, len(epoch1) - 1)) for _ in pairs]
    # one process saves, another (fresh: it never saw the saving loaders) restores every state: torch's import
    # and the forkserver cost seconds a process
    saved = run(*[(first, k, None) for (first, _), k in zip(pairs, cuts)])
    for (first, second), k, a in zip(pairs, cuts, saved):
        assert a["passes"][0]["batches"] == epoch1[:k] and a["passes"][0]["len"] == len(epoch1)
        assert a["state"]["epoch"] == 1 and a["state"]["consumed"] == k, (first, k, a["state"])
    restored = run(*[(second, None, a["state"]) for (_, second), a in zip(pairs, saved)])
    for (first, second), k, b in zip(pairs, cuts, restored):
        rest, whole = b["passes"]
        assert rest["len"] == len(rest["batches"]) == len(epoch1) - k and rest["batches"] == epoch1[k:]
        assert rest["epoch_after"] == 2
        assert whole["len"] == len(whole["batches"]) == len(epoch2) and whole["batches"] == epoch2
        # the state an in-process iterator gives at the same batch: every field (history and ledger included)
        assert b["state"] == json.loads(json.dumps(it.get_state()))


def test_batch_loader_refuses_a_state_of_other_data_and_settings_that_do_not_apply(root, tmp_path):
    from babelfeed.adapters.torch import BatchLoader

    other = tmp_path / "other"
    make_data_bin(other, seed=5)
    state = BatchLoader(config_for(root)).state_dict()
    with pytest.raises(StateMismatch, match="saved with different data or settings"):
        BatchLoader(config_for(other)).load_state_dict(state)
    with pytest.raises(StateError, match="field 'consumed' must be an integer >= 0"):
        BatchLoader(config_for(root)).load_state_dict({**state, "consumed": -1})
    with pytest.raises(StateError, match="field 'epoch' must be an integer >= 1"):
        BatchLoader(config_for(root)).load_state_dict({**state, "epoch": True})
    with pytest.raises(StateError, match="past the end of epoch 1"):
        BatchLoader(config_for(root)).load_state_dict({**state, "consumed": 10 ** 6})
    with pytest.raises(StateError, match=r"holds no babelfeed state \(it has \['consumed', 'epoch'\]\)"):
        BatchLoader(config_for(other)).load_state_dict({"epoch": 1, "consumed": 3})  # no fingerprint: no check
    legacy = {"epoch": 1, "consumed": 3, "fingerprint": state["fingerprint"]}  # an older babelfeed's position
    with pytest.raises(StateError, match="consumed an int >= 0"):
        BatchLoader(config_for(root)).load_state_dict({**legacy, "consumed": -1})
    with pytest.raises(StateMismatch, match="saved with different data or settings"):
        BatchLoader(config_for(other)).load_state_dict(legacy)
    with pytest.raises(UsageError, match="must exceed prefetch_factor=8"):
        BatchLoader(config_for(root), num_workers=1, prefetch_factor=8)
    BatchLoader(config_for(root), num_workers=1, prefetch_factor=8, ring_slots=9)
    with pytest.raises(UsageError, match="batch_size= does not apply"):
        BatchLoader(config_for(root), batch_size=8)
    with pytest.raises(UsageError, match="persistent_workers"):
        BatchLoader(config_for(root), num_workers=1, persistent_workers=True)


def to_numpy(b):
    return {k: to_numpy(v) for k, v in b.items()} if isinstance(b, dict) else (
        b.numpy() if isinstance(b, torch.Tensor) else b)


ELASTIC_LOADER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from golden import digest
from babelfeed.adapters.torch import BatchLoader
from synthetic import config_for


def as_numpy(b):
    return {k: as_numpy(v) for k, v in b.items()} if isinstance(b, dict) else (
        b.numpy() if isinstance(b, torch.Tensor) else b)


if __name__ == "__main__":
    world, state = json.loads(sys.argv[3])
    loaders = [BatchLoader(config_for(sys.argv[2], batching__window=300), rank=r, world_size=world,
                           num_workers=r % 2, multiprocessing_context="forkserver" if r % 2 else None)
               for r in range(world)]
    for loader in loaders:
        loader.load_state_dict(state)
    passes = [[as_numpy(b) for b in loader] for loader in loaders]
    out = [digest(b) for step in zip(*passes) for b in step if b["nsentences"] or b["id"].min() >= 0]
    print(json.dumps({"lens": [len(p) for p in passes], "batches": out,
                      "states": [l.state_dict() for l in loaders]}))
"""


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_batch_loader_state_restores_on_another_world_size(root, tmp_path):
    """Every rank of W takes a random number of steps through its BatchLoader and saves (the same state on each);
    a fresh process restores it on every rank of W' (workers 0 and 1 mixed): the global stream, each step's
    batches in rank order with the epoch's padding batches left out, is the one-rank epoch, every leaf."""
    from golden import digest

    cfg = config_for(root, batching__window=300)
    ref = [digest(b) for b in babelfeed.build_train_iterator(cfg)]
    script = tmp_path / "elastic_loader.py"
    script.write_text(ELASTIC_LOADER)
    rng = np.random.default_rng(21)
    for w, w2 in ((2, 3), (3, 2), (4, 1)):
        loaders = [BatchLoader(cfg, rank=r, world_size=w) for r in range(w)]
        steps = int(rng.integers(1, len(loaders[0]) - 1))
        head = []
        iters = [iter(loader) for loader in loaders]
        for _ in range(steps):
            head += [digest(b) for b in (to_numpy(next(i)) for i in iters) if b["nsentences"] or b["id"].min() >= 0]
        states = [loader.state_dict() for loader in loaders]
        assert all(s == states[0] for s in states) and states[0]["consumed"] == steps * w
        out = subprocess.run([sys.executable, str(script), HERE, str(root), json.dumps([w2, states[0]])],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert len(set(got["lens"])) == 1, got["lens"]
        assert head + got["batches"] == ref, (w, w2, steps)
        assert all(s == got["states"][0] for s in got["states"]), got["states"]
        after = got["states"][0]  # the run's state at epoch 2: its steps counted on both world sizes
        assert (after["epoch"], after["consumed"], after["fingerprint"]) == (2, 0, states[0]["fingerprint"])
        assert after["total_steps"] == steps + -(-(len(ref) - steps * w) // w2)
        assert hist(after).steps == [[0, 1, 0, w], [steps, 1, steps * w, w2]]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_that_batches_the_batches_again_is_refused_by_name(root, workers):
    """DataLoader(BatchDataset(config)) with the default batch_size=1 would stack each batch into [1, B, L] (or fail
    deep in default_collate with 2): it is refused, naming batch_size=None and BatchLoader."""
    from babelfeed.adapters.torch import BatchDataset

    for kwargs in ({}, {"batch_size": 2}) if workers == 0 else ({},):  # (a worker process costs seconds)
        loader = torch.utils.data.DataLoader(BatchDataset(config_for(root)), num_workers=workers, **kwargs,
                                             multiprocessing_context=MP if workers else None)
        with pytest.raises(UsageError, match=r"needs batch_size=None.*BatchLoader"):
            next(iter(loader))
    if workers == 0:  # (batch_size=None with workers: every DataLoader test of this file)
        loader = torch.utils.data.DataLoader(BatchDataset(config_for(root)), batch_size=None)
        first = next(iter(babelfeed.build_train_iterator(config_for(root))))
        assert np.array_equal(next(iter(loader))["target"].numpy(), first["target"])


def test_a_batch_loader_goes_on_after_a_break_where_a_dataloader_starts_over(root):
    """The README's promise: a new pass over a BatchLoader after a break continues with the next batch."""
    from babelfeed.adapters.torch import BatchLoader

    expected = [b["id"] for b in babelfeed.build_train_iterator(config_for(root))]
    assert len(expected) >= 4
    loader = BatchLoader(config_for(root))
    for k, batch in enumerate(loader):
        if k == 1:
            break
    rest = [b["id"].numpy() for b in loader]
    assert len(rest) == len(expected) - 2 and all(np.array_equal(a, b) for a, b in zip(rest, expected[2:]))
    assert loader.epoch == 2
