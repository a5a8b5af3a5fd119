"""examples/lm_train.py: a Flax decoder-only LM on 8 simulated devices, one compilation for its one static shape,
a weight change mid-run, and an orbax checkpoint that a fresh process resumes from exactly."""

import json
import os
import subprocess
import sys

import pytest

import golden

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helpers are

CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import babelfeed
from babelfeed.examples import lm_train

cfg = babelfeed.load_config("lm_packing")
cfg.data_path = f"0.3 {sys.argv[2]}/lm/web 0.7 {sys.argv[2]}/lm/books"
cfg.seq_len, cfg.global_batch, cfg.num_samples, cfg.split = 32, 16, 16 * 40, "100,0,0"
cfg.cache_dir = sys.argv[2] + "/cache"
outs = [lm_train.train(cfg, 12, d_model=32, layers=1, log=lambda *a: None, reweight_at=5, **kw)
        for kw in json.loads(sys.argv[3])]  # (each run its own train(): its own loader, jit and checkpoints)
print(json.dumps(outs))
"""


def run(root, *kws):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", CHILD, HERE, str(root), json.dumps(kws)], capture_output=True,
                         text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_lm_example_trains_on_8_devices_and_resumes_exactly(tmp_path):
    golden.make_lm_data(tmp_path)
    ckpt = tmp_path / "ckpt"
    # the whole run, then one killed after step 8, in one process (a process with 8 devices takes seconds to start)
    whole, first = run(tmp_path, {}, dict(checkpoint_dir=str(ckpt), save_every=4, stop_after=8))
    assert whole["devices"] == 8 and whole["steps"] == 12 and whole["compilations"] == 1
    shares = [d[1] / sum(d) for d in whole["datasets"]]
    assert sum(shares[:5]) / 5 > 0.6 and abs(sum(shares[5:]) / 7 - 0.5) < 0.1  # the reweighting at step 5
    assert first["steps"] == 8 and first["datasets"] == whole["datasets"][:8]
    [rest] = run(tmp_path, dict(checkpoint_dir=str(ckpt), save_every=4))  # a fresh process: from step 8's checkpoint
    assert rest["steps"] == 12 and rest["datasets"] == whole["datasets"][8:]
    assert rest["losses"] == pytest.approx(whole["losses"][8:], rel=1e-5)
