"""babelfeed.adapters.grain: grain workers gather the batches; grain's state resumes at the exact batch, in a fresh
process, with 0, 1 or 2 workers (every leaf of every batch compared).

Runs as a plain script in a fresh process, as users run grain: absl flags unparsed, worker processes that
re-import __main__.
"""

import json
import os
import subprocess
import sys

from synthetic import make_data_bin

HERE = os.path.dirname(os.path.abspath(__file__))

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
    out = subprocess.run([sys.executable, str(script), HERE, str(root), str(tmp_path / "states.pkl"), "resume"],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    resumed = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(resumed) == 3  # 0, 1 and 2 workers, each from its own random cut
    for key, (n, want, same) in resumed.items():
        assert n == want and same, key
