"""The LM iterator through the same adapters as translation: JAX global arrays on 8 fake devices, torch DataLoader
workers, grain workers; exact resume in a fresh process, and on another world size."""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import golden
import babelfeed
from babelfeed.lm.iterator import LMIterator
from babelfeed.errors import CallOrderError, ConfigError, StateError, StateMismatch

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helpers are
LEAVES = ("tokens", "labels", "loss_mask", "segment_ids", "positions", "dataset")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("lmadapters")
    golden.make_lm_data(r)
    return r


def lm_config(root, mode="pack", global_batch=24, batches=20):
    cfg = babelfeed.load_config(os.path.join(os.path.dirname(HERE), "configs", "lm_packing.py"))
    cfg.data_path = f"0.4 {root}/lm/web 0.6 {root}/lm/books"
    cfg.seq_len, cfg.global_batch, cfg.num_samples = 24, global_batch, global_batch * batches
    cfg.split, cfg.mode, cfg.cache_dir = "90,10,0", mode, str(root / "cache")
    return cfg


def digest(batch) -> str:
    """Every leaf of an LM batch (and a batch without all of LEAVES, or with others, differs)."""
    assert set(batch) == set(LEAVES), sorted(batch)
    h = hashlib.sha256()
    for key in LEAVES:
        a = np.asarray(batch[key])
        h.update(f"{key}{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def test_build_iterator_takes_an_lm_config(root):
    cfg = lm_config(root)
    it = babelfeed.build_iterator(cfg, rank=1, world_size=3)
    assert isinstance(it, LMIterator) and (it.rank, it.world_size, it.split) == (1, 3, "rows")
    assert next(it)["tokens"].shape == (8, 24)
    with pytest.raises(ConfigError, match="rows per rank"):
        babelfeed.build_iterator(cfg, split="batches")
    with pytest.raises(ConfigError, match="multiple of world_size"):
        babelfeed.build_iterator(cfg, world_size=5)


ELASTIC = r"""
import json, pathlib, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import babelfeed
from test_lm_adapters import digest, lm_config
out = []
for mode, world, state in json.loads(sys.argv[3]):
    cfg = lm_config(pathlib.Path(sys.argv[2]), mode)
    its = [babelfeed.build_iterator(cfg, rank=r, world_size=world) for r in range(world)]
    for it in its:
        it.set_state(state)
    steps = [list(it) for it in its]
    assert len({len(s) for s in steps}) == 1
    out.append([digest({k: np.concatenate([p[k] for p in parts]) for k in parts[0]}) for parts in zip(*steps)])
print(json.dumps(out))
"""


def test_elastic_resume_at_many_cut_points_in_a_fresh_process(root):
    """For every mode, states saved at world size W after a random number of steps resume at W' in a fresh
    process: the concatenated global batches equal the single-rank run's, every leaf, none missing."""
    rng = np.random.default_rng(5)
    jobs, heads, fulls = [], [], {}
    for mode in ("concat", "pack", "sentences"):
        cfg = lm_config(root, mode)
        fulls[mode] = full = [digest(b) for b in babelfeed.build_iterator(cfg)]
        for _ in range(4):
            w, w2 = (int(x) for x in rng.choice([1, 2, 3, 4, 6, 8], 2, replace=False))
            its = [babelfeed.build_iterator(cfg, rank=r, world_size=w) for r in range(w)]
            cut = int(rng.integers(1, len(full)))
            head = []
            for _ in range(cut):
                parts = [next(it) for it in its]
                head.append(digest({k: np.concatenate([p[k] for p in parts]) for k in parts[0]}))
            states = [it.get_state() for it in its]
            assert all(s == states[0] for s in states)
            jobs.append((mode, w2, states[0]))
            heads.append(head)
    res = subprocess.run([sys.executable, "-c", ELASTIC, HERE, str(root), json.dumps(jobs)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    rests = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(rests) == len(jobs) == 12
    for (mode, w2, state), head, rest in zip(jobs, heads, rests):
        assert head + rest == fulls[mode], (mode, w2, state)


def test_state_is_checked(root):
    cfg = lm_config(root)
    it = babelfeed.build_iterator(cfg)
    next(it)
    state = it.get_state()
    other = babelfeed.build_iterator(lm_config(root, mode="concat"))
    with pytest.raises(StateMismatch, match="saved with different data or settings \\(mode 'pack' -> 'concat'\\)"):
        other.set_state(state)
    with pytest.raises(StateMismatch, match="fingerprint"):  # a state without the identity says only that it differs
        other.set_state({k: v for k, v in state.items() if k != "identity"})
    with pytest.raises(StateError, match="multiple of global_batch"):
        it.set_state({**state, "consumed_samples": 5})
    with pytest.raises(StateError, match="must be an integer >= 0"):
        it.set_state({**state, "consumed_samples": -24})
    with pytest.raises(StateError, match="translation iterator"):
        it.set_state({"version": 1, "epoch": 1, "consumed": 0})
    with pytest.raises(StateError, match="lacks \\['name'\\]"):
        it.set_state({"version": 1, "consumed_samples": 24}, mixture_change="keep_position")
    with pytest.raises(StateError, match="no fingerprint"):
        it.set_state({"version": 1, "name": "train", "consumed_samples": 24})  # a state saved before fingerprints
    it.set_state({"version": 1, "name": "train", "consumed_samples": 24}, mixture_change="keep_position")
    assert it.consumed == 24


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_torch_dataloader_workers_serve_the_in_process_batches(root):
    import torch

    from babelfeed.adapters.torch import BatchDataset

    cfg = lm_config(root)
    # each rank once, each worker count once (a loader's worker processes take seconds to start); these pairs'
    # resumes leave a number of batches the workers do not divide evenly (5 for 3 workers and for 2)
    for rank, workers in ((0, 3), (1, 2)):
        want = [digest(b) for b in babelfeed.build_iterator(cfg, rank=rank, world_size=2)]
        ds = BatchDataset(cfg, rank=rank, world_size=2)
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                         multiprocessing_context="forkserver")
        got = [digest({k: v.numpy() for k, v in b.items()}) for b in dl]
        assert got == want and len(ds) == len(want)
        k = 1 + int(np.random.default_rng(workers + rank).integers(len(want) - 2))  # a random cut
        assert (len(want) - k) % workers  # (the resume's batches do not divide evenly between the workers)
        resumed = BatchDataset(cfg, rank=rank, world_size=2, state=ds.state_dict(k))
        dl = torch.utils.data.DataLoader(resumed, batch_size=None, num_workers=workers,
                                         multiprocessing_context="forkserver")
        assert [digest({k: v.numpy() for k, v in b.items()}) for b in dl] == want[k:]


JAX_CHILD = r"""
import json, pathlib, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import jax
from jax.sharding import Mesh
import babelfeed
from babelfeed.adapters import jax as jax_adapter
from test_lm_adapters import LEAVES, digest, lm_config

assert len(jax.devices()) == 8
cfg = lm_config(pathlib.Path(sys.argv[2]))
report = {}
for name, shape, axes in (("data8", (8,), ("data",)), ("data4_model2", (4, 2), ("data",))):
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("data",) if len(shape) == 1 else ("data", "model"))
    want_all = list(babelfeed.build_iterator(cfg))
    got_all = list(jax_adapter.global_batches(cfg, mesh, data_axes=axes, prefetch=2))
    assert len(got_all) == len(want_all)
    checked = 0
    for want, got in zip(want_all, got_all):
        for key in LEAVES:
            arr = got[key]
            assert isinstance(arr, jax.Array) and arr.shape == want[key].shape, key
            assert np.array_equal(np.asarray(arr), want[key]), key
        per = want["tokens"].shape[0] // shape[0]
        for shard in got["tokens"].addressable_shards:
            d = shard.index[0].start or 0
            assert np.array_equal(np.asarray(shard.data), want["tokens"][d:d + per])
            checked += 1
    report[name] = {"batches": len(got_all), "checked": checked}
mesh = Mesh(np.array(jax.devices()), ("data",))
a = jax_adapter.global_batches(cfg, mesh, prefetch=3)
head = [next(a) for _ in range(5)]
state = a.get_state()
rest = [digest({k: np.asarray(v) for k, v in x.items()}) for x in a]  # every leaf (as JAX holds it)
b = jax_adapter.global_batches(cfg, mesh, prefetch=1)
b.set_state(state)
again = [digest({k: np.asarray(v) for k, v in x.items()}) for x in b]
report["resume"] = len(rest) == len(want_all) - 5 and again == rest
try:  # 6 rows cannot be split over 4 data devices: refused up front, naming the numbers
    jax_adapter.global_batches(lm_config(pathlib.Path(sys.argv[2]), global_batch=6),
                               Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model")), data_axes=("data",))
    report["indivisible"] = "accepted"
except ValueError as e:
    report["indivisible"] = str(e)
print(json.dumps(report))
"""


def test_jax_global_arrays_on_8_devices(root):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", JAX_CHILD, HERE, str(root)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["data8"]["batches"] == 20 and report["data8"]["checked"] == 8 * 20
    assert report["data4_model2"]["checked"] == 8 * 20
    assert report["resume"] is True
    assert "global_batch=6" in report["indivisible"] and "4 devices" in report["indivisible"]


GRAIN_SCRIPT = r'''
import json, pathlib, sys
sys.path.insert(0, sys.argv[1])

if __name__ == "__main__":
    import babelfeed
    from babelfeed.adapters import grain as grain_adapter
    from test_lm_adapters import digest, lm_config

    cfg = lm_config(pathlib.Path(sys.argv[2]))
    want = [digest(b) for b in babelfeed.build_iterator(cfg, rank=1, world_size=2)]
    report = {"batches": len(want)}
    for workers in (0, 2):
        ds = grain_adapter.batch_dataset(cfg, rank=1, world_size=2, num_workers=workers)
        report[f"same_{workers}"] = [digest(b) for b in ds] == want
    it = iter(grain_adapter.batch_dataset(cfg, rank=1, world_size=2, num_workers=2))
    head = [digest(next(it)) for _ in range(6)]
    state = it.get_state()
    it2 = iter(grain_adapter.batch_dataset(cfg, rank=1, world_size=2, num_workers=2))
    it2.set_state(state)
    report["resume"] = head + [digest(b) for b in it2] == want
    print(json.dumps(report))
'''


def test_grain_workers_serve_the_in_process_batches(root, tmp_path):
    script = tmp_path / "lm_grain.py"
    script.write_text(GRAIN_SCRIPT)
    out = subprocess.run([sys.executable, str(script), HERE, str(root)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"batches": 20, "same_0": True, "same_2": True, "resume": True}


def test_batch_loader_over_an_lm_config_is_one_pass_and_resumes_on_another_world_size(root):
    """An LM run is one pass of num_samples: BatchLoader serves it once, says so if asked for a second pass, and
    its state (global batches) restores on another world size: rows of each global batch, every rank."""
    import torch

    from babelfeed.adapters.torch import BatchLoader

    cfg = lm_config(root)
    want = [digest(b) for b in babelfeed.build_iterator(cfg)]
    loaders = [BatchLoader(cfg, rank=r, world_size=2) for r in range(2)]
    cut = 1 + int(np.random.default_rng(5).integers(len(want) - 2))
    iters = [iter(loader) for loader in loaders]
    halves = [[next(i) for _ in range(cut)] for i in iters]
    state = loaders[0].state_dict()
    gb = babelfeed.build_iterator(cfg).global_batch
    assert state == loaders[1].state_dict() and state["consumed_samples"] == cut * gb and state["kind"] == "lm"

    def joined(parts):  # the rows of both ranks' k-th batches, as one global batch
        return [digest({k: np.concatenate([p[j][k].numpy() for p in parts]) for k in LEAVES})
                for j in range(len(parts[0]))]

    assert joined(halves) == want[:cut]
    one = BatchLoader(cfg, world_size=1)
    one.load_state_dict(json.loads(json.dumps(state)))
    rest = [{k: v.numpy() for k, v in b.items()} for b in one]
    assert [digest(b) for b in rest] == want[cut:] and len(rest) == len(want) - cut
    assert one.state_dict()["consumed_samples"] == len(want) * gb and one.epoch == 1
    with pytest.raises(CallOrderError, match="this LM run is over"):
        next(iter(one))
    with pytest.raises(StateError, match="one pass"):  # an older babelfeed's position in epoch 2
        one.load_state_dict({"epoch": 2, "consumed": 1, "fingerprint": state["fingerprint"]})
    assert isinstance(rest[0]["tokens"], np.ndarray) and torch.is_tensor(next(iter(BatchLoader(cfg)))["tokens"])
