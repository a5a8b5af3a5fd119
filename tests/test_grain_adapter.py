"""loader.adapters.grain: grain workers gather the batches; grain's state resumes at the exact batch.

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
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np


def digest(b):
    h = hashlib.sha256()
    for a in (b["id"], b["weight"], b["net_input"]["src_tokens"], b["target"], b["net_input"]["prev_output_tokens"]):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


if __name__ == "__main__":
    import loader
    from loader.adapters import grain as grain_adapter
    from synthetic import config_for

    cfg = config_for(sys.argv[2])
    plain = [digest(b) for b in loader.build_train_iterator(cfg, rank=1, world_size=2)]
    report = {"plain": len(plain)}
    for workers in (0, 1, 2):
        ds = grain_adapter.batch_dataset(cfg, rank=1, world_size=2, num_workers=workers)
        report[f"same_{workers}"] = [digest(b) for b in ds] == plain
    ds = grain_adapter.batch_dataset(cfg, rank=1, world_size=2, num_workers=2)
    it = iter(ds)
    head = [digest(next(it)) for _ in range(5)]
    state = it.get_state()
    it2 = iter(grain_adapter.batch_dataset(cfg, rank=1, world_size=2, num_workers=2))
    it2.set_state(state)
    report["resume"] = head + [digest(b) for b in it2] == plain

    # the same through orbax, as a training job checkpoints: grain's handler saves and restores the iterator
    import grain
    import orbax.checkpoint as ocp

    it = iter(grain_adapter.batch_dataset(cfg, rank=1, world_size=2, num_workers=1))
    head = [digest(next(it)) for _ in range(7)]
    mngr = ocp.CheckpointManager(sys.argv[3])
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
    out = subprocess.run([sys.executable, str(script), HERE, str(root), str(tmp_path / "ckpt")], capture_output=True,
                         text=True,
                         timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["plain"] > 10
    assert report["same_0"] and report["same_1"] and report["same_2"]
    assert report["resume"] and report["orbax"]
