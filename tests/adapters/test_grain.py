"""babelfeed.adapters.grain: grain workers gather the batches; grain's state resumes at the exact batch, in a fresh
process, with 0, 1 or 2 workers (every leaf of every batch compared).

Runs as a plain script in a fresh process, as users run grain: absl flags unparsed, worker processes that
re-import __main__.
"""

import json
import os
import subprocess
import sys

from s3server import s3, s3_env  # noqa: F401  (fixtures)
from synthetic import make_data_bin
from babelfeed.errors import StateError, StateMismatch, UsageError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helpers are

SCRIPT = r'''
import json, pickle, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from golden import digest  # every leaf: key path, dtype, shape, bytes; scalars by value


if __name__ == "__main__":
    import babelfeed
    from babelfeed.adapters import grain as grain_adapter
    from synthetic import config_for

    cfg = config_for(sys.argv[2])
    plain = [digest(b) for b in babelfeed.build_train_iterator(cfg, rank=1, world_size=2)]
    if sys.argv[4] == "resume":  # a fresh process: continue from the states the first process saved
        saved = pickle.load(open(sys.argv[3], "rb"))
        report = {}
        for workers, cut, state in saved:
            it = iter(grain_adapter.batch_dataset(cfg, rank=1, world_size=2, num_workers=workers))
            it.set_state(state)
            rest = [digest(b) for b in it]
            report[f"resume_{workers}_{cut}"] = [len(rest), len(plain) - cut, rest == plain[cut:]]
        print(json.dumps(report))
        sys.exit(0)
    report = {"plain": len(plain)}
    rng = np.random.default_rng(2)
    saved = []
    for workers in (0, 1, 2):  # the whole epoch through grain, with a state saved at a random cut on the way
        cut = int(rng.integers(1, len(plain) - 1))
        got = []
        for b in (it := iter(grain_adapter.batch_dataset(cfg, rank=1, world_size=2, num_workers=workers))):
            got.append(digest(b))
            if len(got) == cut:
                saved.append((workers, cut, it.get_state()))
        report[f"same_{workers}"] = got == plain
    pickle.dump(saved, open(sys.argv[3] + "/states.pkl", "wb"))

    # the same through orbax, as a training job checkpoints: grain's handler saves and restores the iterator
    import grain
    import orbax.checkpoint as ocp

    it = iter(grain_adapter.batch_dataset(cfg, rank=1, world_size=2, num_workers=1))
    head = [digest(next(it)) for _ in range(7)]
    mngr = ocp.CheckpointManager(sys.argv[3] + "/ckpt")
    mngr.save(7, args=ocp.args.Composite(ds=grain.checkpoint.CheckpointSave(it)))
    mngr.wait_until_finished()
    it3 = iter(grain_adapter.batch_dataset(cfg, rank=1, world_size=2, num_workers=1))
    mngr.restore(7, args=ocp.args.Composite(ds=grain.checkpoint.CheckpointRestore(it3)))
    report["orbax"] = head + [digest(b) for b in it3] == plain
    # a batch of a 2-worker iterator left open, held in a global when the interpreter exits (no traceback then)
    held = next(iter(grain_adapter.batch_dataset(cfg, rank=1, world_size=2, num_workers=2)))
    print(json.dumps(report))
'''


def test_grain_workers_and_checkpoint(tmp_path):
    root = tmp_path / "bin"
    make_data_bin(root)
    script = tmp_path / "grain_job.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), HERE, str(root), str(tmp_path), "save"], capture_output=True,
                         text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["plain"] > 10
    assert report["same_0"] and report["same_1"] and report["same_2"]
    assert report["orbax"]
    for noise in ("Traceback", "Exception ignored"):  # at exit, with worker iterators and a batch still held
        assert noise not in out.stderr, out.stderr[-3000:]
    out = subprocess.run([sys.executable, str(script), HERE, str(root), str(tmp_path / "states.pkl"), "resume"],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    resumed = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(resumed) == 3  # 0, 1 and 2 workers, each from its own random cut
    for key, (n, want, same) in resumed.items():
        assert n == want and same, key


EPOCHS = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
from golden import digest


if __name__ == "__main__":
    import babelfeed
    from babelfeed.adapters.grain import EpochsDataset
    from synthetic import config_for

    cfg = config_for(sys.argv[2])
    results = []
    for workers, take, state, epochs in json.loads(sys.argv[3]):  # (each job its own dataset)
        it = iter(EpochsDataset(cfg, rank=1, world_size=2, num_workers=workers, num_epochs=epochs))
        if state is not None:
            it.set_state(state)
        got = []
        for batch in it:
            got.append(digest(batch))
            if take is not None and len(got) == take:
                break
        results.append({"batches": got, "state": it.get_state()})
    print(json.dumps(results))
'''


def test_epochs_dataset_spans_epochs_and_its_state_restores_with_any_worker_count(tmp_path):
    """A state saved with 2 workers mid-epoch-2 restores with 0 (and 0 -> 2, 1 -> 3, cut in epoch 1) in a fresh
    process: the batches before and after the cut are the plain iterator's, every leaf, across the next epoch
    boundary (2 -> 3 for the state of epoch 2, 1 -> 2 for the others); a whole run without a cut ends after
    num_epochs; a state of other data is refused. (The runs with workers stop after epoch 2: grain starts its
    worker processes again each epoch, seconds a time.)"""
    import numpy as np

    import babelfeed
    from golden import digest
    from synthetic import config_for

    root = tmp_path / "bin"
    make_data_bin(root)
    it = babelfeed.build_train_iterator(config_for(root), rank=1, world_size=2)
    epochs = [[digest(b) for b in it] for _ in range(3)]
    plain = [d for e in epochs for d in e]
    script = tmp_path / "epochs_job.py"
    script.write_text(EPOCHS)

    def run(*jobs):
        out = subprocess.run([sys.executable, str(script), HERE, str(root), json.dumps(jobs)],
                             capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    rng = np.random.default_rng(4)
    n1 = len(epochs[0])
    pairs = ((2, 0), (0, 2), (1, 3))
    cuts = [int(rng.integers(n1 + 1, 2 * n1 - 1)) if first == 2 else int(rng.integers(1, n1)) for first, _ in pairs]
    saved = run(*[(first, cut, None, 2) for (first, _), cut in zip(pairs, cuts)])  # (the saves share a process)
    for (first, second), cut, a in zip(pairs, cuts, saved):
        assert a["batches"] == plain[:cut]
        epoch = 1 + (cut >= n1)
        # consumed: global batches of the epoch (2 ranks), so the state is the same on every rank
        assert a["state"]["epoch"] == epoch and a["state"]["consumed"] == 2 * (cut - sum(map(len, epochs[:epoch - 1])))
        last = 3 if epoch == 2 else 2  # (a restore from epoch 2 crosses into epoch 3)
        [b] = run((second, None, a["state"], last))  # each restore in a fresh process
        end = sum(map(len, epochs[:last]))
        assert len(b["batches"]) == end - cut and b["batches"] == plain[cut:end], (first, second, cut)
        assert b["state"]["epoch"] == last + 1 and b["state"]["consumed"] == 0
    other = tmp_path / "other"
    make_data_bin(other, seed=9)
    from babelfeed.adapters.grain import EpochsDataset

    state = iter(EpochsDataset(config_for(root))).get_state()
    with __import__("pytest").raises(StateMismatch, match="saved with different data or settings"):
        iter(EpochsDataset(config_for(other))).set_state(state)


def test_epochs_dataset_state_restores_on_another_world_size_and_refuses_bad_states(tmp_path):
    """Saved by every rank of 3 after a random number of steps (the same state on each), restored by every rank
    of 2 (and of 1): the global stream, each step's batches in rank order with the epoch's padding batches left
    out, is the one-rank stream, every leaf, across the epoch boundary. Malformed states are refused by name."""
    import json

    import numpy as np
    import pytest

    import babelfeed
    from babelfeed.adapters.grain import EpochsDataset
    from golden import digest
    from synthetic import config_for

    root = tmp_path / "bin"
    make_data_bin(root)
    cfg = config_for(root)
    it = babelfeed.build_train_iterator(cfg)
    ref = [digest(b) for b in it] + [digest(b) for b in it]

    def real(b):
        return b["nsentences"] or b["id"].min() >= 0

    def stream(world, state, steps=None):
        its = [iter(EpochsDataset(cfg, rank=r, world_size=world, num_epochs=2)) for r in range(world)]
        if state is not None:
            for i in its:
                i.set_state(json.loads(json.dumps(state)))
        out, k = [], 0
        while steps is None or k < steps:
            step = [next(i, None) for i in its]
            if step[0] is None:
                assert all(b is None for b in step)
                break
            out += [digest(b) for b in step if real(b)]
            k += 1
        states = [i.get_state() for i in its]
        assert all(s == states[0] for s in states), states
        return out, states[0]

    rng = np.random.default_rng(12)
    n3 = -(-len(ref) // 2 // 3)
    for w, w2 in ((3, 2), (2, 1), (1, 3)):
        steps = int(rng.integers(1, 2 * n3))
        head, state = stream(w, None, steps)
        rest, _ = stream(w2, state)
        assert head + rest == ref, (w, w2, steps, state)
    bad = dict(state, consumed=10 ** 6)
    with pytest.raises(StateError, match="past the end of epoch"):
        iter(EpochsDataset(cfg)).set_state(bad)
    with pytest.raises(StateError, match="field 'epoch' must be an integer >= 1"):
        iter(EpochsDataset(cfg)).set_state(dict(state, epoch=True))
    with pytest.raises(StateError, match="has no fingerprint"):
        iter(EpochsDataset(cfg)).set_state({k: v for k, v in state.items() if k != "fingerprint"})
    with pytest.raises(UsageError, match="num_workers must be an int >= 0"):
        EpochsDataset(cfg, num_workers=-1)
    from babelfeed.adapters.grain import batch_dataset

    for bad in (-1, 2.5, "2", True):  # were bare TypeErrors from grain, or (-1) accepted (issue 23 item 16)
        with pytest.raises(UsageError, match=f"num_workers must be an int >= 0 .*got {bad!r}"):
            batch_dataset(cfg, num_workers=bad)
        with pytest.raises(UsageError, match="num_workers must be an int >= 0"):
            EpochsDataset(cfg, num_workers=bad)
    with pytest.raises(UsageError, match="read_threads must be an int >= 0"):
        batch_dataset(cfg, read_threads=1.5)


def test_grain_workers_read_a_store_through_the_one_fetcher(tmp_path, s3_env):
    """Two grain workers (processes) on data in an S3 store share the host's one fetcher: the batches of an epoch
    equal the plain iterator's on the local copy, every leaf, and no byte is fetched twice."""
    import babelfeed
    from babelfeed.storage.remote import client as remote
    from golden import digest
    from synthetic import config_for

    root = tmp_path / "bin"
    make_data_bin(root)
    url = s3_env.upload(str(root), "bkt", "grain/data_bin")
    plain = [digest(b) for b in babelfeed.build_train_iterator(config_for(root), rank=1, world_size=2)]
    script = tmp_path / "epochs_job.py"
    script.write_text(EPOCHS)
    out = subprocess.run([sys.executable, str(script), HERE, url, json.dumps([[2, None, None, 1]])],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])[0]["batches"]
    assert len(got) == len(plain) and got == plain
    st, data = remote.stats(), sum(p.stat().st_size for p in root.rglob("*.bin"))
    assert st["bytes"] - st["bytes_again"] <= data and st["bytes_again"] <= 0.25 * data, st  # (each byte kept once)


def test_workers_built_at_a_scripts_top_level_are_refused_in_one_line(tmp_path):
    """grain's workers re-run the script ("spawn"): a pipeline built outside `if __name__ == "__main__":` gave 100+
    lines of tracebacks from every process. It is refused before a worker starts; under the guard it is built."""
    root = tmp_path / "bin"
    make_data_bin(root)
    head = (f"import sys; sys.path.insert(0, {HERE!r})\nfrom synthetic import config_for\n"
            f"from babelfeed.adapters import grain as grain_adapter\ncfg = config_for({str(root)!r})\n")
    for body, ok in (("it = iter(grain_adapter.batch_dataset(cfg, num_workers=1))\nprint(next(it)['id'][:1])\n",
                      False),
                     ("def main():\n    return grain_adapter.EpochsDataset(cfg, num_workers=1)\nmain()\n", False),
                     # (workers under the guard: test_grain_workers_and_checkpoint's script runs them; here, no start)
                     ("def main():\n    return grain_adapter.batch_dataset(cfg, num_workers=1)\n"
                      "if __name__ == '__main__':\n    main()\n", True)):
        script = tmp_path / "job.py"
        script.write_text(head + body)
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                             cwd=str(tmp_path))
        if ok:
            assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
        else:
            assert out.returncode == 1 and 'put the pipeline under `if __name__ == "__main__":`' in out.stderr
            assert out.stderr.count("Traceback") == 1 and "bootstrapping" not in out.stderr, out.stderr[-3000:]
